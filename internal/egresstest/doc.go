// Package egresstest holds the end-to-end tests of sandboxes' network
// policy (issue #19): a real `warren serve` whose resolver's upstream is a
// fake internet (internal/testenv/fakenet), and real clients inside
// sandboxes (Python's socket and urllib, curl, Node's fetch, pip) trying
// what the policy allows and what it must refuse, each refusal fast. The
// suite lives in the package's tests; `make test-egress` runs it alone.
package egresstest
