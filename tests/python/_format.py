"""An independent reader of the zctipc segment header, written from
docs/format.md alone, so that the golden vectors check the document as well
as the Go code that wrote them."""

import struct
import zlib

MAGIC = 0x5A435449
VERSION = 1
FIXED = 128
MAX_NDIM = 32
INT64_MAX = 2**63 - 1
ITEMSIZE = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8, 13: 2, 14: 8, 15: 16}
KINDS = {1, 2, 3, 4, 5, 6, 7}
FLAG_TRACKED = 1 << 8


class FormatError(Exception):
    """A header the document says to refuse; ``cls`` is the class of error."""

    def __init__(self, cls, why):
        super().__init__(f"{cls}: {why}")
        self.cls = cls


def decode(data, file_size):
    """Validate the header at the start of ``data`` in the document's order
    and return its fields, or raise FormatError."""
    if len(data) < 4 or struct.unpack_from("<I", data)[0] != MAGIC:
        raise FormatError("not_zctipc", "magic")
    if len(data) >= 6 and struct.unpack_from("<H", data, 4)[0] != VERSION:
        raise FormatError("version", "version")
    if len(data) < FIXED:
        raise FormatError("corrupt", "truncated")
    (_, _, header_len, flags, dtype, ndim, data_offset, nbytes, pid, start, created, checksum) = struct.unpack_from(
        "<IHHIHHQQqQqI", data
    )
    if ndim > MAX_NDIM:
        raise FormatError("corrupt", "ndim")
    if header_len != FIXED + 16 * ndim or len(data) < header_len:
        raise FormatError("corrupt", "header_len")
    crc = zlib.crc32(data[FIXED:header_len], zlib.crc32(data[:56]))
    if crc != checksum:
        raise FormatError("corrupt", "checksum")
    if flags & ~(0xFF | FLAG_TRACKED) or (flags & 0xFF) not in KINDS:
        raise FormatError("corrupt", "flags")
    if any(data[60:64]) or any(data[72:128]):
        raise FormatError("corrupt", "reserved")
    if dtype not in ITEMSIZE:
        raise FormatError("dtype", "dtype")
    shape = struct.unpack_from(f"<{ndim}q", data, FIXED)
    strides = struct.unpack_from(f"<{ndim}q", data, FIXED + 8 * ndim)
    if any(d < 0 for d in shape) or any(s < 0 for s in strides):
        raise FormatError("corrupt", "negative")
    product = ITEMSIZE[dtype]
    for d in shape:
        product *= d or 1
    if product > INT64_MAX:
        raise FormatError("corrupt", "overflow")
    extent = 0 if 0 in shape else sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + ITEMSIZE[dtype]
    if extent > INT64_MAX or extent > nbytes:
        raise FormatError("corrupt", "extent")
    if data_offset % 64 or data_offset < header_len:
        raise FormatError("corrupt", "data_offset")
    if data_offset + nbytes > INT64_MAX or data_offset + nbytes > file_size:
        raise FormatError("corrupt", "past end")
    (refcount,) = struct.unpack_from("<q", data, 64)
    return {
        "kind": flags & 0xFF,
        "tracked": bool(flags & FLAG_TRACKED),
        "dtype_code": dtype,
        "shape": list(shape),
        "strides": list(strides),
        "header_len": header_len,
        "data_offset": data_offset,
        "nbytes": nbytes,
        "creator_pid": pid,
        "creator_start_time": start,
        "created_ns": created,
        "refcount": refcount,
        "checksum": checksum,
    }
