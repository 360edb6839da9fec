// Package zctipc is zero-copy tensor IPC for Go programs: the same shared
// segments, queues and streams that the Python package and the C ABI use,
// so that Go and Python processes hand each other tensors without copies.
//
// A Tensor lives in a segment of its own (NewTensor, AttachTensor, or a
// TensorRef's JSON from any language) or arrives in a Queue; Values views it
// as a []float32 (or any element type) over the shared memory. A Queue
// carries tensors as descriptors and raw bytes; Python's pickles are opaque
// here. A Stream is a ring of fixed-size frames for one writer and many
// readers. Blocking calls take a context.Context, whose cancellation wakes
// them at once. docs/format.md specifies every byte that crosses.
//
// # Concurrency and Close
//
// Tensor, Queue, Stream, StreamWriter and StreamReader are safe for
// concurrent use. Close may be called from any goroutine at any time: calls
// blocked on the object wake and return ErrClosed, and so does every method
// called afterwards, on a nil object too. Closing a second time returns
// ErrClosed. The slices a Tensor, a StreamWriter or a StreamReader hands out
// (Bytes, Values, Look) are views of shared memory: use them before Close
// (and, for a frame, before Increment).
//
// # Cleanup
//
// The first object a program makes or attaches turns on crash cleanup, as
// Python processes do: the process records the counts it holds in a ledger
// and registers with the user's cleanup daemon, which gives them up when
// the process ends without closing them: a return from main, SIGTERM,
// SIGKILL. When no daemon runs, the program starts itself as one (its init
// runs the daemon when ZCTIPC_DAEMON_SELF is set), so nothing else need be
// installed; $ZCTIPC_DAEMON names a zctipcd to start instead, and
// ZCTIPC_CLEANUP=0 turns cleanup off.
package zctipc

import "github.com/zctipc/zctipc/go/internal/version"

// Version is the release of the library.
const Version = version.Version
