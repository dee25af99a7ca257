module github.com/warren-sandbox/warren/sdk

go 1.26
