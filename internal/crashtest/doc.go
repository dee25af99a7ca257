// Package crashtest holds the crash-recovery suite: a real `warren serve`
// killed with SIGKILL at random moments of a seeded stream of mixed
// operations, restarted, and checked after every restart (acknowledged work
// kept, the database consistent with the host, nothing leaked), plus the
// faults a server meets on a bad day: its data directory's file system
// full, its database locked by another process, a sandbox's agent killed
// in the middle of a request. The package has tests only.
package crashtest
