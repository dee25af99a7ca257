module github.com/warren-sandbox/warren

go 1.26.0

require (
	github.com/opencontainers/runtime-spec v1.3.0
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.49.0
)
