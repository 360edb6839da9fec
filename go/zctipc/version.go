// Package zctipc is zero-copy tensor IPC for Go programs: the same shared
// segments, queues and streams that the Python package and the C ABI use.
package zctipc

// Version is the release of the library, shared by the Go packages, the C
// ABI (zct_version) and the Python package.
const Version = "0.1.0"
