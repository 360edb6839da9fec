"""The golden header vectors, decoded by the library (through the C ABI) and
by an independent reader written from docs/format.md."""

import json
import os

import pytest
from _format import FormatError, decode

import zctipc
from zctipc._core import native as _native

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "golden")
with open(os.path.join(GOLDEN, "header_v1.json")) as f:
    VECTORS = json.load(f)["vectors"]

# What each error class becomes in Python.
EXCEPTIONS = {
    "not_zctipc": zctipc.NotAZctipcSegment,
    "version": zctipc.IncompatibleVersion,
    "corrupt": zctipc.CorruptHeader,
    "dtype": zctipc.UnsupportedDtype,
}


def read_vector(vector):
    with open(os.path.join(GOLDEN, vector["file"]), "rb") as f:
        return f.read()


def native_decode(data):
    ffi, lib = _native.ffi(), _native.lib()
    info = ffi.new("zct_info *")
    head = data[:640]
    _native.check(lib.zct_header_decode(head, len(head), len(data), info))
    ndim = info.ndim
    return {
        "kind": info.kind,
        "dtype_code": info.dtype,
        "shape": list(info.shape[0:ndim]),
        "strides": list(info.strides[0:ndim]),
        "data_offset": info.data_offset,
        "nbytes": info.nbytes,
        "creator_pid": info.creator_pid,
        "creator_start_time": info.creator_start_time,
        "created_ns": info.created_ns,
        "refcount": info.refcount,
    }


def test_there_are_valid_and_invalid_vectors():
    assert sum(1 for v in VECTORS if "header" in v) >= 5
    assert {v["error"] for v in VECTORS if "error" in v} == set(EXCEPTIONS)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_independent_reader_agrees(vector):
    data = read_vector(vector)
    if "error" in vector:
        with pytest.raises(FormatError) as err:
            decode(data, len(data))
        assert err.value.cls == vector["error"]
        return
    got = decode(data, len(data))
    for field, value in got.items():
        assert vector["header"][field] == value, field


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_library_agrees(vector):
    data = read_vector(vector)
    if "error" in vector:
        with pytest.raises(EXCEPTIONS[vector["error"]]):
            native_decode(data)
        return
    got = native_decode(data)
    for field, value in got.items():
        assert vector["header"][field] == value, field


def test_data_of_a_valid_vector_reads_back():
    import numpy as np

    vector = next(v for v in VECTORS if v["name"] == "float32_2x3")
    data = read_vector(vector)
    h = vector["header"]
    raw = np.frombuffer(data, dtype=np.uint8, count=h["nbytes"], offset=h["data_offset"])
    assert list(raw[:5]) == [0, 1, 2, 3, 4]
