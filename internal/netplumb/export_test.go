package netplumb

// VethName exposes candidate n of id's interface name to the tests.
var VethName = (*Host).vethName
