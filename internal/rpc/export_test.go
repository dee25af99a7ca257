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
