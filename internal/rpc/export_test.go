package rpc

import "sort"

// MethodNames lists the methods s serves, sorted (for the fuzz targets,
// which run every one).
func (s *Server) MethodNames() []string {
	names := make([]string, 0, len(s.methods))
	for n := range s.methods {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// BulkBytes is the size from which a body or an output is bulk (fair.go).
const BulkBytes = bulkBytes

// BulkWaiting is how many of tenant's requests are or wait to be its bulk
// request.
func (s *Server) BulkWaiting(tenant string) int { return s.bulk.waiting(tenant) }
