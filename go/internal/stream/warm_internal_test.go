package stream

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWarmDistance: Note [how far apart a writer reuses a slot], from what
// a machine reports: 4 MiB, and on AMD family 23 twice its L3 (never less
// than 4 MiB, nor a size read wrong).
func TestWarmDistance(t *testing.T) {
	for _, c := range []struct {
		vendor string
		family int
		l3     uint64
		want   uint64
	}{
		{"GenuineIntel", 6, 32 << 20, 4 << 20},
		{"GenuineIntel", 6, 0, 4 << 20},
		{"AuthenticAMD", 23, 8 << 20, 16 << 20},
		{"AuthenticAMD", 23, 32 << 20, 64 << 20},
		{"AuthenticAMD", 23, 1 << 20, 4 << 20},
		{"AuthenticAMD", 23, 0, 4 << 20},
		{"AuthenticAMD", 23, 1 << 62, 4 << 20},
		{"AuthenticAMD", 25, 32 << 20, 4 << 20},
		{"AuthenticAMD", 26, 32 << 20, 4 << 20},
		{"AuthenticAMD", 0, 8 << 20, 4 << 20},
		{"", 23, 8 << 20, 4 << 20},
	} {
		require.Equal(t, c.want, warmDistance(c.vendor, c.family, c.l3), "%s family %d, L3 %d", c.vendor, c.family, c.l3)
	}
}

// TestCacheBytesAndVendorFromFiles: the sizes and vendor read from sysfs
// and cpuinfo as Linux writes them, and nothing from files that are not
// there or say something else.
func TestCacheBytesAndVendorFromFiles(t *testing.T) {
	dir := t.TempDir()
	index := func(i int, level, typ, size string) {
		d := filepath.Join(dir, "index"+string(rune('0'+i)))
		require.NoError(t, os.MkdirAll(d, 0o755))
		for name, v := range map[string]string{"level": level, "type": typ, "size": size} {
			require.NoError(t, os.WriteFile(filepath.Join(d, name), []byte(v+"\n"), 0o644))
		}
	}
	index(0, "1", "Data", "32K")
	index(1, "1", "Instruction", "64K")
	index(2, "2", "Unified", "512K")
	index(3, "3", "Unified", "8192K")
	require.Equal(t, uint64(8<<20), cacheBytes(dir, 3))
	require.Equal(t, uint64(512<<10), cacheBytes(dir, 2))
	require.Equal(t, uint64(32<<10), cacheBytes(dir, 1), "the data cache, not the instruction one")
	require.Zero(t, cacheBytes(dir, 4))
	require.Zero(t, cacheBytes(filepath.Join(dir, "absent"), 3))
	index(3, "3", "Unified", "32M")
	require.Equal(t, uint64(32<<20), cacheBytes(dir, 3))
	index(3, "3", "Unified", "lots")
	require.Zero(t, cacheBytes(dir, 3))

	info := filepath.Join(dir, "cpuinfo")
	require.NoError(t, os.WriteFile(info, []byte("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\n"+
		"processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"), 0o644))
	vendor, family := cpuVendor(info)
	require.Equal(t, "AuthenticAMD", vendor, "the first processor's")
	require.Equal(t, 23, family)
	require.NoError(t, os.WriteFile(info, []byte("processor\t: 0\ncpu family\t: many\n"), 0o644))
	vendor, family = cpuVendor(info)
	require.Empty(t, vendor)
	require.Zero(t, family)
	vendor, family = cpuVendor(filepath.Join(dir, "absent"))
	require.Empty(t, vendor)
	require.Zero(t, family)
}
