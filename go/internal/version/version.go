// Package version holds the release of the library, shared by the Go
// packages, the C ABI (zct_version), the cleanup daemon and the Python
// package (setup.py reads it).
package version

// Version is the release of the library.
const Version = "0.1.0"
