package shm_test

import (
	"fmt"
	"testing"

	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/shm"
)

// BenchmarkAttach measures attaching a segment this process does not map
// yet (as a consumer does), and closing it again.
func BenchmarkAttach(b *testing.B) {
	for _, size := range []int64{1 << 20, 100 << 20} {
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			seg, err := shm.Create("", header.KindTensor, dtype.Uint8, []int64{size})
			if err != nil {
				b.Fatalf("Create: %v", err)
			}
			name := seg.Name()
			// An in-flight count keeps the segment while no handle is open.
			if _, err := seg.AddRef(); err != nil {
				b.Fatalf("AddRef: %v", err)
			}
			if err := seg.Close(); err != nil {
				b.Fatalf("Close: %v", err)
			}
			b.ResetTimer()
			for range b.N {
				s, err := shm.Attach(name, header.KindTensor, false)
				if err != nil {
					b.Fatalf("Attach: %v", err)
				}
				if err := s.Close(); err != nil {
					b.Fatalf("Close: %v", err)
				}
			}
			b.StopTimer()
			s, err := shm.Attach(name, header.KindTensor, false)
			if err != nil {
				b.Fatalf("Attach: %v", err)
			}
			if _, err := s.DropRef(); err != nil {
				b.Fatalf("DropRef: %v", err)
			}
			if err := s.Close(); err != nil {
				b.Fatalf("Close: %v", err)
			}
		})
	}
}
