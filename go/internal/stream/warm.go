package stream

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Note [how far apart a writer reuses a slot]. Under Block a writer whose
// readers keep up goes round the free slots released longest ago, warm
// bytes of them (Writer's WarmSlots), not the whole ring. A slot reused
// sooner than that holds lines still in the reader's core's own cache, and
// each one it writes is taken from that core first. How much farther pays
// depends on the last level cache:
//   - Intel's L3 is shared by every core of the die: a line the reader's
//     core let go of is in it, and writing it costs less than fetching it
//     from memory. 4 MiB is past a core's L2 and well inside that L3; going
//     round the whole ring instead made a 1 MiB-frame stream with one
//     reader 1.35x slower.
//   - AMD's Zen 1 and Zen 2 (family 23) have an L3 for each complex of four
//     cores, filled with what their L2s let go of; the cores of a virtual
//     machine may lie in different complexes whatever the topology they are
//     shown says, and a line held in another complex's L3 cost more to
//     write than one from memory. On an EPYC (family 23) virtual machine
//     with an L3 of 8 MiB, 1 MiB frames and one reader moved 40 Gbit/s with
//     4 MiB warm and 54 with 16 MiB or the whole ring; with four readers
//     81-87 against 91-93.
//   - From Zen 3 on (family 25 and later) one L3 serves eight cores, and
//     behaves as Intel's does here: on an EPYC (family 26) virtual machine
//     with an L3 of 32 MiB, 1 MiB frames and one reader moved 44-46 K
//     frames/s with 2 or 4 MiB warm and 25-28 K with the whole 32 MiB ring
//     (eight runs of each, taking turns); two and four readers, bound by
//     the readers' cores, moved as many either way.
//
// So the distance is 4 MiB, and on AMD family 23 twice the L3 (at least
// 4 MiB), as the machine reports them.

// warmDefault is the distance where Note [how far apart a writer reuses a
// slot] says nothing else.
const warmDefault = 4 << 20

// warmBytes is that distance for this machine, read once.
var warmBytes = sync.OnceValue(func() uint64 {
	vendor, family := cpuVendorFamily("/proc/cpuinfo")
	return warmDistance(vendor, family, cacheBytes("/sys/devices/system/cpu/cpu0/cache", 3))
})

// warmDistance is Note [how far apart a writer reuses a slot]'s rule for a
// CPU vendor and family (as /proc/cpuinfo's vendor_id and cpu family say
// them) and the bytes of its last level cache (0 when unknown).
func warmDistance(vendor string, family int, l3 uint64) uint64 {
	if vendor == "AuthenticAMD" && family == 23 && l3 > 0 && l3 < 1<<40 {
		return max(warmDefault, 2*l3)
	}
	return warmDefault
}

// cpuVendorFamily returns the first vendor_id and cpu family in the cpuinfo file
// at path: "" and 0 for what it does not say or when it cannot be read.
func cpuVendorFamily(path string) (vendor string, family int) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(key) {
		case "vendor_id":
			if vendor == "" {
				vendor = strings.TrimSpace(value)
			}
		case "cpu family":
			if family == 0 {
				family, _ = strconv.Atoi(strings.TrimSpace(value))
			}
		}
		if vendor != "" && family != 0 {
			break
		}
	}
	return vendor, family
}

// cacheBytes returns the size of the unified or data cache of the given
// level among a CPU's caches under dir (sysfs's cpuN/cache: index*/level,
// type and size, such as "8192K"), or 0 when none says so.
func cacheBytes(dir string, level int) uint64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	read := func(name, file string) string {
		b, err := os.ReadFile(dir + "/" + name + "/" + file)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "index") || read(name, "level") != strconv.Itoa(level) || read(name, "type") == "Instruction" {
			continue
		}
		size := read(name, "size")
		unit := uint64(1)
		switch {
		case strings.HasSuffix(size, "K"):
			unit, size = 1<<10, strings.TrimSuffix(size, "K")
		case strings.HasSuffix(size, "M"):
			unit, size = 1<<20, strings.TrimSuffix(size, "M")
		}
		n, err := strconv.ParseUint(size, 10, 32)
		if err != nil {
			return 0
		}
		return n * unit
	}
	return 0
}
