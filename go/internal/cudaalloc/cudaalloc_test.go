package cudaalloc_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/cuda"
	"github.com/zctipc/zctipc/go/internal/cudaalloc"
	"github.com/zctipc/zctipc/go/internal/cudatest"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// The caching allocator, run against the stand-in driver in a helper
// process (the driver is loaded once per process): blocks by kind, reuse
// without the driver, streams kept apart, sharing, trimming, out of memory.
func TestCudaCacheWithTheStandInDriver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	h := cudatest.StartMockHelper(t, "mock-cache")
	for _, want := range []string{
		"blocks 512 1024 1024 3145728 zero 0",
		"same slab true",
		"creates 3 after reuse 3 hits 5",
		"other stream creates 4",
		"shared offset 10 of 2097152 on 0",
		"not ours true true",
		"trimmed 4 segments 0",
	} {
		require.Equal(t, want, h.ReadLine(t))
	}
	h.Wait(t)
}

// When the driver runs out, the cache gives back what it holds unused and
// tries once more; then the error says what is free.
func TestCudaCacheOutOfMemoryWithTheStandInDriver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	h := cudatest.StartMockHelper(t, "mock-cache-oom")
	require.Equal(t, "retried after trimming: trimmed 1 reserved 6291456", h.ReadLine(t))
	line := h.ReadLine(t)
	require.True(t, strings.HasPrefix(line, "out of memory true: CUDA device 0 is out of memory: 6291456 bytes asked, 0 of 8388608 free"), line)
	h.Wait(t)
}

// A block of the cache sent to another process: the consumer maps the
// allocation once however often the block arrives, reads the producer's
// bytes, and keeps reading them after the producer was killed (a VMM
// allocation lives while any process maps it).
func TestCudaCacheBlocksAcrossProcessesOutliveTheProducer(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer := cudatest.StartMockHelper(t, "mock-cache-producer")
	desc := producer.ReadLine(t)
	consumer := cudatest.StartMockHelper(t, "mock-cache-consumer", desc)
	require.Equal(t, "imports 1 byte 7", consumer.ReadLine(t))
	require.NoError(t, producer.Cmd.Process.Signal(syscall.SIGKILL))
	require.Error(t, producer.Cmd.Wait())
	consumer.Send(t, "read")
	require.Equal(t, "after the producer died: byte 7", consumer.ReadLine(t))
	consumer.Wait(t)
}

// A consumer keeps at most cuda.KeepIdle allocations mapped that no view
// uses (each holds the producer's GPU memory), the most recently idle.
func TestCudaIdleMappingsAreBoundedWithTheStandInDriver(t *testing.T) {
	testenv.SkipShort(t, "crosses processes")
	producer := cudatest.StartMockHelper(t, "mock-cache-many")
	names := producer.ReadLine(t)
	consumer := cudatest.StartMockHelper(t, "mock-cache-idle", names)
	require.Equal(t, fmt.Sprintf("mapped %d imports 10", cuda.KeepIdle), consumer.ReadLine(t))
	require.Equal(t, "the newest again: imports 10; the oldest again: imports 11", consumer.ReadLine(t))
	consumer.Wait(t)
	producer.Send(t, "done")
	producer.Wait(t)
}

func init() {
	testenv.Helpers["mock-cache-many"] = func(args []string) error {
		c := cudaalloc.New()
		var names []string
		for range 10 {
			p, err := c.Alloc(0, 2<<20, 0) // a large block: an allocation each
			if err != nil {
				return err
			}
			sh, err := c.Share(p)
			if err != nil {
				return err
			}
			names = append(names, sh.Name)
		}
		fmt.Println(strings.Join(names, ","))
		_, err := testenv.StdinLine()
		return err
	}
	testenv.Helpers["mock-cache-idle"] = func(args []string) error {
		names := strings.Split(args[0], ",")
		var none [cuda.HandleSize]byte
		for _, name := range names {
			if _, err := cuda.OpenShared(name, 0, none, 0); err != nil {
				return err
			}
			cuda.CloseShared(name)
		}
		fmt.Println("mapped", cuda.Mapped(), "imports", cuda.ImportCount())
		if _, err := cuda.OpenShared(names[9], 0, none, 0); err != nil {
			return err
		}
		cuda.CloseShared(names[9])
		newest := cuda.ImportCount()
		if _, err := cuda.OpenShared(names[0], 0, none, 0); err != nil {
			return err
		}
		cuda.CloseShared(names[0])
		fmt.Printf("the newest again: imports %d; the oldest again: imports %d\n", newest, cuda.ImportCount())
		return cuda.Forget(0)
	}
	testenv.Helpers["mock-cache"] = func(args []string) error {
		c := cudaalloc.New()
		sizes := []uint64{100, 1000, 600, 3 << 20}
		alloc := func() ([]uint64, []uint64, error) {
			var ptrs, blocks []uint64
			for _, n := range sizes {
				before := c.Stats().InUse
				p, err := c.Alloc(0, n, 0)
				if err != nil {
					return nil, nil, err
				}
				ptrs, blocks = append(ptrs, p), append(blocks, c.Stats().InUse-before)
			}
			return ptrs, blocks, nil
		}
		ptrs, blocks, err := alloc()
		if err != nil {
			return err
		}
		zero, err := c.Alloc(0, 0, 0)
		if err != nil {
			return err
		}
		fmt.Println("blocks", blocks[0], blocks[1], blocks[2], blocks[3], "zero", zero)
		fmt.Println("same slab", ptrs[2]-ptrs[1] == 1024 && c.Stats().Creates == 3)
		for _, p := range ptrs {
			if err := c.Free(p); err != nil {
				return err
			}
		}
		if ptrs, _, err = alloc(); err != nil {
			return err
		}
		st := c.Stats()
		fmt.Println("creates", st.Creates, "after reuse", st.Creates, "hits", st.Hits) // 1 in the first round (600 in 1000's slab), 4 in the second
		other, err := c.Alloc(0, 100, 0xbeef)
		if err != nil {
			return err
		}
		fmt.Println("other stream creates", c.Stats().Creates)
		sh, err := c.Share(other + 10)
		if err != nil {
			return err
		}
		fmt.Println("shared offset", sh.Offset, "of", sh.Size, "on", sh.Device)
		errFree := c.Free(other + 1)
		_, errShare := c.Share(0x1000)
		fmt.Println("not ours", errors.Is(errFree, cudaalloc.ErrNotOurs), errors.Is(errShare, cudaalloc.ErrNotOurs))
		for _, p := range append(ptrs, other) {
			if err := c.Free(p); err != nil {
				return err
			}
		}
		n := c.Trim(-1)
		fmt.Println("trimmed", n, "segments", c.Stats().Segments)
		return nil
	}
	testenv.Helpers["mock-cache-oom"] = func(args []string) error {
		if err := os.Setenv("ZCTIPC_MOCK_CUDA_MEMORY", "8388608"); err != nil { // read by the driver on every call
			return err
		}
		c := cudaalloc.New()
		p, err := c.Alloc(0, 3<<20, 0)
		if err != nil {
			return err
		}
		if err := c.Free(p); err != nil {
			return err
		}
		if _, err := c.Alloc(0, 6<<20, 0); err != nil {
			return err
		}
		st := c.Stats()
		fmt.Println("retried after trimming: trimmed", st.Trimmed, "reserved", st.Reserved)
		if _, err := c.Alloc(0, 1, 0); err != nil { // a slab of 2 MiB: 8 MiB in use
			return err
		}
		_, err = c.Alloc(0, 6<<20, 0)
		var oom *cuda.OutOfMemory
		fmt.Printf("out of memory %v: %v\n", errors.As(err, &oom), err)
		return nil
	}
	testenv.Helpers["mock-cache-producer"] = func(args []string) error {
		c := cudaalloc.New()
		if _, err := c.Alloc(0, 4096, 0); err != nil { // so the block sent is not at offset 0
			return err
		}
		p, err := c.Alloc(0, 4096, 0)
		if err != nil {
			return err
		}
		cudatest.HostBytes(p, 4096)[100] = 7
		sh, err := c.Share(p + 100)
		if err != nil {
			return err
		}
		e, err := cuda.ExportEvent(sh.Device, 0)
		if err != nil {
			return err
		}
		fmt.Println(sh.Name, sh.Offset, hex.EncodeToString(e.Event[:]))
		_, err = testenv.StdinLine() // killed before it reads
		return err
	}
	testenv.Helpers["mock-cache-consumer"] = func(args []string) error {
		var name, eventHex string
		var offset uint64
		if _, err := fmt.Sscan(args[0], &name, &offset, &eventHex); err != nil {
			return err
		}
		if offset != 4096+100 {
			return fmt.Errorf("offset %d", offset)
		}
		var event [cuda.HandleSize]byte
		hex.Decode(event[:], []byte(eventHex))
		var ptr uint64
		for range 1000 {
			p, err := cuda.OpenShared(name, offset, event, 0)
			if err != nil {
				return err
			}
			ptr = p
			cuda.CloseShared(name)
		}
		fmt.Println("imports", cuda.ImportCount(), "byte", cudatest.HostBytes(ptr, 1)[0])
		if _, err := testenv.StdinLine(); err != nil {
			return err
		}
		fmt.Println("after the producer died: byte", cudatest.HostBytes(ptr, 1)[0])
		os.Stdout.Sync()
		return cuda.Forget(0)
	}
}
