// Package hostile is the hostile-workload suite (issue #18): attacks a
// hostile tenant would try — from inside sandboxes, through the API with a
// namespace key, through crafted images, and as an unprivileged host user —
// run end to end against a real `warren serve` while three victim sandboxes
// of another namespace serve execs. Each attempt prints CONTAINED or BREACH;
// a BREACH fails the suite, as do victims' exec latency past its bound, the
// server's memory past its bound, or anything left behind. The suite lives
// in the package's tests; docs/security.md says how to run it.
package hostile
