//go:build !embedagent

package agentbin

var (
	embeddedAgent, embeddedSpawner       []byte
	embeddedAgentSum, embeddedSpawnerSum string
)
