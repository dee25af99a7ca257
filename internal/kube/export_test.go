package kube

// SetMaxResponse lowers the answer bound for a test; it returns the undo.
func SetMaxResponse(n int) func() {
	old := maxResponse
	maxResponse = n
	return func() { maxResponse = old }
}
