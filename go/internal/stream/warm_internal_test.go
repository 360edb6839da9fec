package stream

import (
	"os"
	"path/filepath"
	"strings"
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
	vendor, family := cpuVendorFamily(info)
	require.Equal(t, "AuthenticAMD", vendor, "the first processor's")
	require.Equal(t, 23, family)
	require.NoError(t, os.WriteFile(info, []byte("processor\t: 0\ncpu family\t: many\n"), 0o644))
	vendor, family = cpuVendorFamily(info)
	require.Empty(t, vendor)
	require.Zero(t, family)
	vendor, family = cpuVendorFamily(filepath.Join(dir, "absent"))
	require.Empty(t, vendor)
	require.Zero(t, family)
}

// TestCpuVendorFromOddFiles: cpuinfo as other kernels, architectures and
// hand-made files write it. The family is read whether it comes before or
// after the vendor; what is not a family (missing, empty, a word, a number
// out of range) reads as 0, or as a family other than 23, so that such a
// machine keeps the 4 MiB default.
func TestCpuVendorFromOddFiles(t *testing.T) {
	dir := t.TempDir()
	read := func(text string) (string, int) {
		path := filepath.Join(dir, "cpuinfo")
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		return cpuVendorFamily(path)
	}
	for _, c := range []struct {
		name, text string
		vendor     string
		family     int
		distance   uint64 // with an 8 MiB L3
	}{
		{"family first", "cpu family\t: 23\nvendor_id\t: AuthenticAMD\n", "AuthenticAMD", 23, 16 << 20},
		{"spaces", "  vendor_id  :   AuthenticAMD  \r\n cpu family :\t 23 \t\n", "AuthenticAMD", 23, 16 << 20},
		{"no family", "vendor_id\t: AuthenticAMD\nmodel\t: 1\n", "AuthenticAMD", 0, 4 << 20},
		{"empty family", "vendor_id\t: AuthenticAMD\ncpu family\t:\n", "AuthenticAMD", 0, 4 << 20},
		{"hex family", "vendor_id\t: AuthenticAMD\ncpu family\t: 0x17\n", "AuthenticAMD", 0, 4 << 20},
		{"huge family", "vendor_id\t: AuthenticAMD\ncpu family\t: 99999999999999999999999\n", "AuthenticAMD", 1<<63 - 1, 4 << 20},
		{"negative family", "vendor_id\t: AuthenticAMD\ncpu family\t: -23\n", "AuthenticAMD", -23, 4 << 20},
		{"23 and more", "vendor_id\t: AuthenticAMD\ncpu family\t: 23 (Zen)\n", "AuthenticAMD", 0, 4 << 20},
		{"another key", "vendor_id\t: AuthenticAMD\ncpu family name\t: 23\ncpu familyx: 23\n", "AuthenticAMD", 0, 4 << 20},
		{"a later processor's family", "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: zen\n" +
			"processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\n", "AuthenticAMD", 23, 16 << 20},
		{"the first family", "vendor_id\t: AuthenticAMD\ncpu family\t: 25\ncpu family\t: 23\n", "AuthenticAMD", 25, 4 << 20},
		{"Hygon", "vendor_id\t: HygonGenuine\ncpu family\t: 24\n", "HygonGenuine", 24, 4 << 20},
		{"Intel family 23", "vendor_id\t: GenuineIntel\ncpu family\t: 23\n", "GenuineIntel", 23, 4 << 20},
		{"arm64", "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU architecture: 8\n", "", 0, 4 << 20},
		{"no colons", "vendor_id AuthenticAMD\ncpu family 23\n", "", 0, 4 << 20},
		{"empty", "", "", 0, 4 << 20},
		{"a line past the scanner's buffer first", "flags\t: " + strings.Repeat("x", 1<<17) + "\n" +
			"vendor_id\t: AuthenticAMD\ncpu family\t: 23\n", "", 0, 4 << 20},
		{"no newline at the end", "vendor_id\t: AuthenticAMD\ncpu family\t: 23", "AuthenticAMD", 23, 16 << 20},
		{"a colon in the value", "vendor_id\t: Authentic:AMD\ncpu family\t: 23\n", "Authentic:AMD", 23, 4 << 20},
	} {
		vendor, family := read(c.text)
		require.Equal(t, c.vendor, vendor, c.name)
		require.Equal(t, c.family, family, c.name)
		require.Equal(t, c.distance, warmDistance(vendor, family, 8<<20), c.name)
	}
}
