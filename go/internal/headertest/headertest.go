// Package headertest holds the golden vectors of the segment header
// (tests/golden, docs/format.md): the Go encoder that makes them, the
// reader of the files, and the class of a decoding error. The header's
// tests check the encoder against the files (and rewrite them with
// -update); other tests feed the files to what decodes segments. Only
// tests import it.
package headertest

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"encoding/json"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/proc"
	"github.com/zctipc/zctipc/go/internal/testenv"
)

// Dir is tests/golden, the directory of the golden vectors.
var Dir = filepath.Join(testenv.ModuleRoot(), "tests", "golden")

// File is tests/golden/header_v1.json.
type File struct {
	Comment string   `json:"comment"`
	Vectors []Vector `json:"vectors"`
}

// Vector is one golden vector: a whole segment file, with the header it
// decodes to or the class of the error it must raise.
type Vector struct {
	Name   string  `json:"name"`
	File   string  `json:"file"`
	Header *Header `json:"header,omitempty"`
	Error  string  `json:"error,omitempty"` // not_zctipc, version, corrupt or dtype
	Bytes  []byte  `json:"-"`               // the file's bytes
}

// Header is the decoded header a valid vector must give.
type Header struct {
	Kind             int     `json:"kind"`
	DType            string  `json:"dtype"`
	DTypeCode        int     `json:"dtype_code"`
	Shape            []int64 `json:"shape"`
	Strides          []int64 `json:"strides"`
	HeaderLen        int     `json:"header_len"`
	DataOffset       uint64  `json:"data_offset"`
	NBytes           uint64  `json:"nbytes"`
	CreatorPID       int64   `json:"creator_pid"`
	CreatorStartTime uint64  `json:"creator_start_time"`
	CreatedNS        int64   `json:"created_ns"`
	Refcount         int64   `json:"refcount"`
	Tracked          bool    `json:"tracked"`
	Checksum         uint32  `json:"checksum"`
}

var le = binary.LittleEndian

// SegmentBytes encodes a whole tensor segment with fixed identity fields and
// data bytes i % 251, so that the vectors never change.
func SegmentBytes(t testing.TB, dt dtype.DType, shape []int64) (header.Header, []byte) {
	return trackedBytes(t, dt, shape, false)
}

func trackedBytes(t testing.TB, dt dtype.DType, shape []int64, tracked bool) (header.Header, []byte) {
	h, err := header.New(header.KindTensor, dt, shape)
	require.NoError(t, err)
	h.Tracked = tracked
	h.Creator = proc.Identity{PID: 4242, StartTime: 987654}
	h.CreatedNS = 1767225600123456789
	h.Refcount = 1
	buf := make([]byte, h.SegmentSize())
	h.Encode(buf)
	for i := range buf[h.DataOffset:] {
		buf[h.DataOffset+uint64(i)] = byte(i % 251)
	}
	return h, buf
}

// Reseal recomputes the checksum after a field was changed on purpose, so
// that the vector reaches the check it is meant to fail.
func Reseal(b []byte) []byte {
	le.PutUint32(b[56:], header.Checksum(b))
	return b
}

func mutated(t testing.TB, dt dtype.DType, shape []int64, edit func(b []byte) []byte) []byte {
	_, b := SegmentBytes(t, dt, shape)
	return edit(b)
}

// Vectors makes the golden vectors with the Go encoder.
func Vectors(t testing.TB) []Vector {
	validTracked := func(name string, dt dtype.DType, shape []int64, tracked bool) Vector {
		h, b := trackedBytes(t, dt, shape, tracked)
		return Vector{Name: name, Bytes: b, Header: &Header{
			Kind: int(h.Kind), DType: dt.String(), DTypeCode: int(dt), Shape: h.Shape, Strides: h.Strides,
			HeaderLen: h.Len(), DataOffset: h.DataOffset, NBytes: h.NBytes,
			CreatorPID: h.Creator.PID, CreatorStartTime: h.Creator.StartTime, CreatedNS: h.CreatedNS,
			Refcount: h.Refcount, Tracked: h.Tracked, Checksum: le.Uint32(b[56:]),
		}}
	}
	valid := func(name string, dt dtype.DType, shape []int64) Vector {
		return validTracked(name, dt, shape, false)
	}
	bad := func(name, errClass string, b []byte) Vector {
		return Vector{Name: name, Error: errClass, Bytes: b}
	}
	f32 := []int64{2, 3}
	return []Vector{
		valid("float32_2x3", dtype.Float32, f32),
		valid("int64_scalar", dtype.Int64, []int64{}),
		valid("uint8_empty", dtype.Uint8, []int64{0}),
		valid("bfloat16_4x1x2", dtype.BFloat16, []int64{4, 1, 2}),
		valid("complex128_3", dtype.Complex128, []int64{3}),
		valid("bool_5", dtype.Bool, []int64{5}),
		validTracked("float32_2x3_tracked", dtype.Float32, f32, true),
		bad("empty_file", "not_zctipc", []byte{}),
		bad("not_zctipc", "not_zctipc", []byte("this is not a zctipc segment, only some text of the right length to look like one at first")),
		bad("version_2", "version", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint16(b[4:], 2); return Reseal(b) })),
		bad("flipped_checksum_byte", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { b[57] ^= 0x40; return b })),
		bad("flipped_shape_byte", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { b[128] ^= 0x01; return b })),
		bad("truncated_header", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { return b[:100] })),
		bad("truncated_data", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { return b[:len(b)-1] })),
		bad("ndim_33", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte {
			b = append(b, make([]byte, 16*33)...)
			le.PutUint16(b[14:], 33)
			le.PutUint16(b[6:], uint16(header.FixedSize+16*33))
			return Reseal(b)
		})),
		bad("header_len_mismatch", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint16(b[6:], 144); return Reseal(b) })),
		bad("shape_overflows_int64", "corrupt", mutated(t, dtype.Int64, []int64{2, 3}, func(b []byte) []byte {
			le.PutUint64(b[128:], 1<<62)
			le.PutUint64(b[136:], 4)
			return Reseal(b)
		})),
		bad("strides_past_data", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint64(b[144:], 16); return Reseal(b) })),
		bad("negative_dimension", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint64(b[128:], ^uint64(0)); return Reseal(b) })),
		bad("data_past_file_end", "corrupt", mutated(t, dtype.Uint8, []int64{24}, func(b []byte) []byte {
			le.PutUint64(b[24:], 1<<20)
			le.PutUint64(b[128:], 1<<20)
			return Reseal(b)
		})),
		bad("data_offset_unaligned", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint64(b[16:], 161); return Reseal(b) })),
		bad("unknown_flag_bit", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint32(b[8:], 1|1<<9); return Reseal(b) })),
		bad("reserved_not_zero", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { b[100] = 1; return b })),
		bad("unknown_kind", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint32(b[8:], 9); return Reseal(b) })),
		bad("unknown_dtype", "dtype", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint16(b[12:], 99); return Reseal(b) })),
	}
}

// Read reads the golden vectors' files.
func Read(t testing.TB) File {
	raw, err := os.ReadFile(filepath.Join(Dir, "header_v1.json"))
	require.NoError(t, err)
	var file File
	require.NoError(t, json.Unmarshal(raw, &file))
	for i := range file.Vectors {
		file.Vectors[i].Bytes, err = os.ReadFile(filepath.Join(Dir, file.Vectors[i].File))
		require.NoError(t, err)
	}
	return file
}

// ErrorClass is the class of a decoding error, as the golden vectors name
// it: not_zctipc, version, corrupt or dtype ("other: ..." for none).
func ErrorClass(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, header.ErrNotZctipc):
		return "not_zctipc"
	case errors.Is(err, header.ErrVersion):
		return "version"
	case errors.Is(err, header.ErrCorrupt):
		return "corrupt"
	case errors.Is(err, dtype.ErrUnsupported):
		return "dtype"
	}
	return "other: " + err.Error()
}
