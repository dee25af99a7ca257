// Package service is what the agent serves to the host over the agent
// protocol (Server): exec, background processes, files and REPLs. Exec and
// background processes share one process lifecycle (process). Processes
// are started through a Starter, PID 1's reaper (setup.Reaper) in the
// agent.
package service
