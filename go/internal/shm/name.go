package shm

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every segment the library creates, so that its
// files in /dev/shm can be told from everyone else's.
const Prefix = "zctipc_"

// FDPrefix starts the name of every memfd segment (the file_descriptor
// strategy). It cannot start a name that FullName makes, so the two kinds of
// names never meet.
const FDPrefix = "zctipc-fd-"

// TmpPrefix starts the temporary name a segment file has while it is being
// created, before it is renamed to its own.
const TmpPrefix = "zctipc-tmp-"

// MaxNameLen is the longest name a caller may give, in bytes, not counting
// the prefix.
const MaxNameLen = 200

// DirEnv names the environment variable that moves segments out of /dev/shm
// (for tests that need a small tmpfs); it must name a tmpfs directory.
const DirEnv = "ZCTIPC_SHM_DIR"

// Dir returns the directory that holds segments: $ZCTIPC_SHM_DIR or /dev/shm.
func Dir() string {
	if d := os.Getenv(DirEnv); d != "" {
		return strings.TrimRight(d, "/")
	}
	return "/dev/shm"
}

// FullName returns name with the library prefix, adding it when name does not
// already start with it, after checking that name is safe to use as a file
// name: 1 to MaxNameLen bytes of letters, digits, '_', '-' and '.', with no
// ".." in it. A bad name gives an error wrapping unix.EINVAL.
func FullName(name string) (string, error) {
	if strings.HasPrefix(name, FDPrefix) {
		if !isHexName(name[len(FDPrefix):]) {
			return "", fmt.Errorf("memfd segment name %q is not one zctipc made: %w", name, unix.EINVAL)
		}
		return name, nil
	}
	base := strings.TrimPrefix(name, Prefix)
	switch {
	case base == "":
		return "", fmt.Errorf("segment name %q is empty: %w", name, unix.EINVAL)
	case len(base) > MaxNameLen:
		return "", fmt.Errorf("segment name of %d bytes is longer than %d: %w", len(base), MaxNameLen, unix.EINVAL)
	case strings.Contains(base, ".."):
		return "", fmt.Errorf("segment name %q contains \"..\": %w", name, unix.EINVAL)
	}
	for i, c := range []byte(base) {
		if !nameByte(c) {
			// The character as written (a whole UTF-8 sequence, or the byte
			// where it is none), not its first byte read as Latin-1.
			_, size := utf8.DecodeRuneInString(base[i:])
			bad := base[i : i+size]
			return "", fmt.Errorf("segment name %q contains %q; use letters, digits, '_', '-' and '.': %w", name, bad, unix.EINVAL)
		}
	}
	return Prefix + base, nil
}

func nameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.'
}

// IsFDName reports whether name is that of a memfd segment.
func IsFDName(name string) bool { return strings.HasPrefix(name, FDPrefix) }

// IsTmpName reports whether name is a temporary name that Create makes.
func IsTmpName(name string) bool {
	return strings.HasPrefix(name, TmpPrefix) && isHexName(name[len(TmpPrefix):])
}

func isHexName(s string) bool {
	if len(s) != 32 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// RandomName returns a new name: the prefix and 128 random bits in hex.
func RandomName() string { return randomName(Prefix) }

func randomName(prefix string) string {
	var b [16]byte
	rand.Read(b[:]) // never fails: crypto/rand crashes the program instead
	return prefix + hex.EncodeToString(b[:])
}

// List returns the names of every file of the library in Dir() (with the
// prefix, or the temporary prefix of a segment being created), sorted,
// whether or not it holds a valid segment.
func List() ([]string, error) {
	entries, err := os.ReadDir(Dir())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", Dir(), err)
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), Prefix) || strings.HasPrefix(e.Name(), TmpPrefix) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names, nil
}
