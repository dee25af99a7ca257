//go:build embedagent

package agentbin

import _ "embed"

//go:embed warren-agent
var embeddedAgent []byte

//go:embed warren-spawner
var embeddedSpawner []byte
