package futex

// pause tells the CPU that this is a spin-wait loop (x86 PAUSE): it saves
// power and lets a sibling hardware thread run.
//
//go:noescape
func pause()
