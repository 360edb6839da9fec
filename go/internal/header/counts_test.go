package header_test

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/plane"
)

// TestCountsAreThePlanes holds ByteCount and Extent to the plane's
// zp_byte_count and zp_extent, which count the same in C (ByteCount says
// why there are two): over the edges of each overflow, and at random.
func TestCountsAreThePlanes(t *testing.T) {
	t.Parallel()
	edges := []int64{0, 1, 2, 3, 1 << 31, 1<<32 - 1, 1 << 32, 1 << 40, 1<<62 - 1, 1 << 62, math.MaxInt64 - 1, math.MaxInt64,
		-1, math.MinInt64}
	r := rand.New(rand.NewPCG(7, 11))
	pick := func() int64 {
		if r.IntN(3) == 0 {
			return int64(r.Uint64())
		}
		return edges[r.IntN(len(edges))]
	}
	for range 200000 {
		ndim := r.IntN(5)
		shape, strides := make([]int64, ndim), make([]int64, ndim)
		for i := range ndim {
			shape[i], strides[i] = pick(), pick()
		}
		itemsize := []int{0, 1, 2, 4, 8, 16}[r.IntN(6)]
		n, ok := header.ByteCount(shape, itemsize)
		pn, pok := plane.ByteCount(shape, itemsize)
		if n != pn || ok != pok {
			t.Fatalf("ByteCount(%v, %d) = %d, %v; the plane's %d, %v", shape, itemsize, n, ok, pn, pok)
		}
		e, ok := header.Extent(shape, strides, itemsize)
		pe, pok := plane.Extent(shape, strides, itemsize)
		if e != pe || ok != pok {
			t.Fatalf("Extent(%v, %v, %d) = %d, %v; the plane's %d, %v", shape, strides, itemsize, e, ok, pe, pok)
		}
	}
}
