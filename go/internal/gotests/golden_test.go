package gotests

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zctipc/zctipc/go/internal/dtype"
	"github.com/zctipc/zctipc/go/internal/header"
	"github.com/zctipc/zctipc/go/internal/proc"
)

var update = flag.Bool("update", false, "rewrite the golden vectors in tests/golden")

const goldenDir = "../../../tests/golden"

// goldenFile is tests/golden/header_v1.json.
type goldenFile struct {
	Comment string         `json:"comment"`
	Vectors []goldenVector `json:"vectors"`
}

type goldenVector struct {
	Name   string        `json:"name"`
	File   string        `json:"file"`
	Header *goldenHeader `json:"header,omitempty"`
	Error  string        `json:"error,omitempty"` // not_zctipc, version, corrupt or dtype
	bytes  []byte
}

type goldenHeader struct {
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

// segmentBytes encodes a whole tensor segment with fixed identity fields and
// data bytes i % 251, so that the vectors never change.
func segmentBytes(t testing.TB, dt dtype.DType, shape []int64) (header.Header, []byte) {
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

// reseal recomputes the checksum after a field was changed on purpose, so
// that the vector reaches the check it is meant to fail.
func reseal(b []byte) []byte {
	le.PutUint32(b[56:], header.Checksum(b))
	return b
}

func mutated(t testing.TB, dt dtype.DType, shape []int64, edit func(b []byte) []byte) []byte {
	_, b := segmentBytes(t, dt, shape)
	return edit(b)
}

func goldenVectors(t testing.TB) []goldenVector {
	validTracked := func(name string, dt dtype.DType, shape []int64, tracked bool) goldenVector {
		h, b := trackedBytes(t, dt, shape, tracked)
		return goldenVector{Name: name, bytes: b, Header: &goldenHeader{
			Kind: int(h.Kind), DType: dt.String(), DTypeCode: int(dt), Shape: h.Shape, Strides: h.Strides,
			HeaderLen: h.Len(), DataOffset: h.DataOffset, NBytes: h.NBytes,
			CreatorPID: h.Creator.PID, CreatorStartTime: h.Creator.StartTime, CreatedNS: h.CreatedNS,
			Refcount: h.Refcount, Tracked: h.Tracked, Checksum: le.Uint32(b[56:]),
		}}
	}
	valid := func(name string, dt dtype.DType, shape []int64) goldenVector {
		return validTracked(name, dt, shape, false)
	}
	bad := func(name, errClass string, b []byte) goldenVector {
		return goldenVector{Name: name, Error: errClass, bytes: b}
	}
	f32 := []int64{2, 3}
	return []goldenVector{
		valid("float32_2x3", dtype.Float32, f32),
		valid("int64_scalar", dtype.Int64, []int64{}),
		valid("uint8_empty", dtype.Uint8, []int64{0}),
		valid("bfloat16_4x1x2", dtype.BFloat16, []int64{4, 1, 2}),
		valid("complex128_3", dtype.Complex128, []int64{3}),
		valid("bool_5", dtype.Bool, []int64{5}),
		validTracked("float32_2x3_tracked", dtype.Float32, f32, true),
		bad("empty_file", "not_zctipc", []byte{}),
		bad("not_zctipc", "not_zctipc", []byte("this is not a zctipc segment, only some text of the right length to look like one at first")),
		bad("version_2", "version", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint16(b[4:], 2); return reseal(b) })),
		bad("flipped_checksum_byte", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { b[57] ^= 0x40; return b })),
		bad("flipped_shape_byte", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { b[128] ^= 0x01; return b })),
		bad("truncated_header", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { return b[:100] })),
		bad("truncated_data", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { return b[:len(b)-1] })),
		bad("ndim_33", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte {
			b = append(b, make([]byte, 16*33)...)
			le.PutUint16(b[14:], 33)
			le.PutUint16(b[6:], uint16(header.FixedSize+16*33))
			return reseal(b)
		})),
		bad("header_len_mismatch", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint16(b[6:], 144); return reseal(b) })),
		bad("shape_overflows_int64", "corrupt", mutated(t, dtype.Int64, []int64{2, 3}, func(b []byte) []byte {
			le.PutUint64(b[128:], 1<<62)
			le.PutUint64(b[136:], 4)
			return reseal(b)
		})),
		bad("strides_past_data", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint64(b[144:], 16); return reseal(b) })),
		bad("negative_dimension", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint64(b[128:], ^uint64(0)); return reseal(b) })),
		bad("data_past_file_end", "corrupt", mutated(t, dtype.Uint8, []int64{24}, func(b []byte) []byte {
			le.PutUint64(b[24:], 1<<20)
			le.PutUint64(b[128:], 1<<20)
			return reseal(b)
		})),
		bad("data_offset_unaligned", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint64(b[16:], 161); return reseal(b) })),
		bad("unknown_flag_bit", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint32(b[8:], 1|1<<9); return reseal(b) })),
		bad("reserved_not_zero", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { b[100] = 1; return b })),
		bad("unknown_kind", "corrupt", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint32(b[8:], 9); return reseal(b) })),
		bad("unknown_dtype", "dtype", mutated(t, dtype.Float32, f32, func(b []byte) []byte { le.PutUint16(b[12:], 99); return reseal(b) })),
	}
}

func TestGolden(t *testing.T) {
	vectors := goldenVectors(t)
	if *update {
		file := goldenFile{Comment: "Generated by `make golden` from the Go encoder; do not edit. See docs/format.md."}
		for _, v := range vectors {
			v.File = v.Name + ".bin"
			require.NoError(t, os.WriteFile(filepath.Join(goldenDir, v.File), v.bytes, 0o644))
			file.Vectors = append(file.Vectors, v)
		}
		raw, err := json.MarshalIndent(file, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(goldenDir, "header_v1.json"), append(raw, '\n'), 0o644))
	}
	file := readGolden(t)
	require.Len(t, file.Vectors, len(vectors), "run `make golden` after adding a vector")
	for i, v := range vectors {
		require.Equal(t, v.Name, file.Vectors[i].Name)
		require.Equal(t, v.bytes, file.Vectors[i].bytes, "%s: the encoder no longer writes the golden bytes", v.Name)
	}
}

func readGolden(t testing.TB) goldenFile {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "header_v1.json"))
	require.NoError(t, err)
	var file goldenFile
	require.NoError(t, json.Unmarshal(raw, &file))
	for i := range file.Vectors {
		file.Vectors[i].bytes, err = os.ReadFile(filepath.Join(goldenDir, file.Vectors[i].File))
		require.NoError(t, err)
	}
	return file
}

// decodeFile decodes a whole segment file the way shm.Attach does: a copy of
// at most header.MaxSize bytes, and the file's size.
func decodeFile(b []byte) (header.Header, error) {
	return header.Decode(append([]byte(nil), b[:min(len(b), header.MaxSize)]...), uint64(len(b)))
}

func errorClass(err error) string {
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

func TestGoldenDecode(t *testing.T) {
	for _, v := range readGolden(t).Vectors {
		t.Run(v.Name, func(t *testing.T) {
			h, err := decodeFile(v.bytes)
			if v.Error != "" {
				require.Equal(t, v.Error, errorClass(err), "error: %v", err)
				return
			}
			require.NoError(t, err)
			want := v.Header
			require.Equal(t, header.KindTensor, h.Kind)
			require.Equal(t, want.DType, h.DType.String())
			require.Equal(t, want.Shape, h.Shape)
			require.Equal(t, want.Strides, h.Strides)
			require.Equal(t, want.HeaderLen, h.Len())
			require.Equal(t, want.DataOffset, h.DataOffset)
			require.Equal(t, want.NBytes, h.NBytes)
			require.Equal(t, proc.Identity{PID: want.CreatorPID, StartTime: want.CreatorStartTime}, h.Creator)
			require.Equal(t, want.CreatedNS, h.CreatedNS)
			require.Equal(t, want.Refcount, h.Refcount)
			require.Equal(t, want.Tracked, h.Tracked)
			require.Zero(t, h.DataOffset%header.DataAlign)
		})
	}
}
