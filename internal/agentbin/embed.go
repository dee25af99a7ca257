//go:build embedagent

package agentbin

import _ "embed"

// The binaries and their SHA-256 digests in hex, all four written by
// `make build`.

//go:embed warren-agent
var embeddedAgent []byte

//go:embed warren-agent.sha256
var embeddedAgentSum string

//go:embed warren-spawner
var embeddedSpawner []byte

//go:embed warren-spawner.sha256
var embeddedSpawnerSum string
