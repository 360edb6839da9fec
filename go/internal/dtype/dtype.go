// Package dtype holds the element types that a zctipc segment can carry and
// the numeric codes that the segment header stores for them.
//
// The codes are part of the wire format (docs/format.md): they never change
// meaning, and new types only take new codes.
package dtype

import (
	"errors"
	"fmt"
)

// DType is the element type of a tensor, as stored in a segment header.
type DType uint16

// The codes of header layout version 1. Zero is never a valid type.
const (
	Invalid    DType = 0
	Bool       DType = 1
	Int8       DType = 2
	Int16      DType = 3
	Int32      DType = 4
	Int64      DType = 5
	Uint8      DType = 6
	Uint16     DType = 7
	Uint32     DType = 8
	Uint64     DType = 9
	Float16    DType = 10
	Float32    DType = 11
	Float64    DType = 12
	BFloat16   DType = 13
	Complex64  DType = 14
	Complex128 DType = 15
)

// ErrUnsupported is returned for a code that names no known type.
var ErrUnsupported = errors.New("unsupported dtype")

type info struct {
	name string
	size int
}

var table = [...]info{
	Invalid:    {"invalid", 0},
	Bool:       {"bool", 1},
	Int8:       {"int8", 1},
	Int16:      {"int16", 2},
	Int32:      {"int32", 4},
	Int64:      {"int64", 8},
	Uint8:      {"uint8", 1},
	Uint16:     {"uint16", 2},
	Uint32:     {"uint32", 4},
	Uint64:     {"uint64", 8},
	Float16:    {"float16", 2},
	Float32:    {"float32", 4},
	Float64:    {"float64", 8},
	BFloat16:   {"bfloat16", 2},
	Complex64:  {"complex64", 8},
	Complex128: {"complex128", 16},
}

// Valid reports whether d is one of the known codes.
func (d DType) Valid() bool {
	return d != Invalid && int(d) < len(table)
}

// Size returns the size of one element in bytes, or 0 for an unknown code.
func (d DType) Size() int {
	if !d.Valid() {
		return 0
	}
	return table[d].size
}

// String returns the NumPy-style name of d ("float32", "bfloat16").
func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint16(d))
	}
	return table[d].name
}

// Check returns nil for a known code and an error wrapping ErrUnsupported
// otherwise.
func (d DType) Check() error {
	if !d.Valid() {
		return fmt.Errorf("dtype code %d: %w", uint16(d), ErrUnsupported)
	}
	return nil
}

// FromCode returns the DType of code, a code held wider than the header's
// u16 (a C caller's int32, a stream layout's u32), or an error wrapping
// ErrUnsupported for one that names no known type: a negative code, or one
// past 16 bits, among them, which a conversion to DType would wrap onto
// its low 16 bits (65547 onto float32).
func FromCode(code int64) (DType, error) {
	d := DType(code)
	if int64(d) != code || !d.Valid() {
		return Invalid, fmt.Errorf("dtype code %d: %w", code, ErrUnsupported)
	}
	return d, nil
}

// Parse returns the DType named name, as String spells it.
func Parse(name string) (DType, error) {
	for code, t := range table {
		if DType(code) != Invalid && t.name == name {
			return DType(code), nil
		}
	}
	return Invalid, fmt.Errorf("dtype %q: %w", name, ErrUnsupported)
}
