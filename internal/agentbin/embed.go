//go:build embedagent

package agentbin

import _ "embed"

//go:embed warren-agent
var embedded []byte
