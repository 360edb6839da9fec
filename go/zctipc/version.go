// Package zctipc is zero-copy tensor IPC for Go programs: the same shared
// segments, queues and streams that the Python package and the C ABI use,
// so that Go and Python processes hand each other tensors without copies.
//
// A Tensor lives in a segment of its own (NewTensor, AttachTensor, or a
// TensorRef's JSON from any language) or arrives in a Queue; Values views it
// as a []float32 (or any element type) over the shared memory. A Queue
// carries tensors as descriptors and raw bytes; Python's pickles are opaque
// here. A Stream is a ring of fixed-size frames for one writer and many
// readers. Blocking calls take a context.Context. docs/format.md specifies
// every byte that crosses.
package zctipc

import "github.com/zctipc/zctipc/go/version"

// Version is the release of the library.
const Version = version.Version
