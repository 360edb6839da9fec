//go:build !amd64

package futex

// pause is a no-op where there is no spin-wait hint to give.
func pause() {}
