"""Attacks on a bare tensor's put in one call (Queue._put_tensor,
exports.tensor_view): views that reach outside their pool buffer, tricks
of storage offset, stride and dtype, and tensors whose memory is not a pool
buffer's. Each must arrive in another process with exactly its values (and,
when it went by descriptor, its shape and strides), or its put must raise a
clear error; nothing may be read past a buffer."""

import ctypes

import numpy as np
import pytest
import torch

import zctipc
from zctipc._wire import exports

pytestmark = pytest.mark.slow

GET = 60  # seconds any get may wait for the child


def _report_each(inq, outq, n):
    """Take n tensors; report each one's values, shape, strides and dtype."""
    for _ in range(n):
        t = inq.get()
        values = t.resolve_conj().resolve_neg().tolist()
        outq.put((values, tuple(t.shape), t.stride(), str(t.dtype), t.requires_grad))
    outq.put("done")


def _raw(addr, n):
    """A tensor over n bytes at addr, memory torch did not allocate."""
    return torch.from_numpy(np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr)))


def _values(t):
    return t.detach().resolve_conj().resolve_neg().tolist()


def test_tricky_tensors_arrive_exactly():
    ctx = zctipc.get_context("spawn")
    q, out = ctx.Queue(), ctx.Queue()
    # Four neighbouring pool buffers of one size: a view that reaches out of
    # one reaches into the next.
    bs = [zctipc.empty(1024, torch.uint8).fill_(i + 1) for i in range(4)]
    b = bs[1]
    f = zctipc.empty(16, torch.float32).copy_(torch.arange(16.0))
    shared = zctipc.create_shared_tensor(shape=(4, 4), dtype=torch.float32)
    st = shared.torch()
    st.copy_(torch.arange(16.0).view(4, 4))
    onto = zctipc.empty(16, torch.float32)
    onto.set_(torch.arange(16.0))  # its storage now torch's own memory
    sent = {
        # (tensor, whether it may go by descriptor as it lies)
        "spans the next buffer": (_raw(b.data_ptr() + 512, 1024), False),
        "starts before its buffer": (_raw(b.data_ptr() - 64, 128), False),
        "the whole buffer, raw": (_raw(b.data_ptr(), 1024), True),
        "offset before the view's start": (f[4:].as_strided((4,), (1,), 0), True),
        "stride reaching the last element": (f.as_strided((4,), (5,), 0), True),
        "zero strides": (f.as_strided((1000, 3), (0, 1), 2), True),
        "an expand of one element": (f[3:4].expand(1 << 10, 1 << 4), True),
        "bool": (bs[2][:8].view(torch.bool), True),
        "bfloat16 steps": (f.view(torch.bfloat16)[1::3], True),
        "complex": (f.view(torch.complex64), True),
        "conj": (f.view(torch.complex64).conj(), False),
        "neg": (f.view(torch.complex64).conj().imag, False),
        "requires grad": (f.clone().requires_grad_(), False),
        "0-dim": (f[5], True),
        "empty": (f[3:3], False),
        "empty with strides": (f.as_strided((0, 5), (1, 100), 0), False),
        "set_ onto torch memory": (onto, False),
        "a SharedTensor": (st, False),
        "a view of a SharedTensor": (st.t()[1:], False),
    }
    for name, (t, bare) in sent.items():
        # A bare one may go by descriptor as it lies; the others go the long
        # way, or by descriptor only where the library finds them whole in
        # one pool buffer or segment.
        assert (exports.tensor_view(t) is not None) >= bare, name
    p = ctx.Process(target=_report_each, args=(q, out, len(sent)))
    p.start()
    try:
        for t, _ in sent.values():
            q.put(t)
        for name, (t, bare) in sent.items():
            values, shape, strides, dtype, grad = out.get(timeout=GET)
            assert values == _values(t), name
            assert shape == tuple(t.shape), name
            assert dtype == str(t.dtype), name
            assert grad == t.requires_grad, name
            if bare:
                assert strides == t.stride(), name
        assert out.get(timeout=GET) == "done"
    finally:
        p.join(GET)
    assert p.exitcode == 0
    # A view that crossed into a neighbour went as a copy: no neighbour was
    # handed over with it.
    for i, n in enumerate(bs):
        assert (n == i + 1).all()
    shared.close()
    shared.unlink()


@pytest.mark.parametrize(
    "make",
    [
        lambda b: _raw(b.data_ptr() + 512, 1024),  # into the next slot
        lambda b: _raw(b.data_ptr() - 8, 16),  # from the slot before
    ],
    ids=["past-end", "before-start"],
)
def test_memory_outside_one_slot_is_not_put_by_descriptor(make):
    """The one call refuses (False: the long way copies) any extent that
    does not lie in one pool slot."""
    bs = [zctipc.empty(1024, torch.uint8) for _ in range(4)]
    q = zctipc.Queue()
    try:
        t = make(bs[1])
        assert q._put_tensor(t) is not True
    finally:
        q.close()


def test_a_huge_expand_whose_bytes_overflow_is_a_bad_argument():
    """An expand whose element count times its item size overflows 64 bits
    (strides 0: its extent is one element) is the caller's bad argument
    (InvalidArgument), on the one call and the long way alike: not a
    malformed message (CorruptHeader names bytes a get read), never a
    fault, and the queue stays empty."""
    f = zctipc.empty(4, torch.float32).fill_(7)
    t = f[0:1].expand(1 << 31, 1 << 31)  # 2**62 elements, 2**64 bytes
    q = zctipc.Queue()
    try:
        with pytest.raises(zctipc.InvalidArgument, match="descriptor counts"):
            q._put_tensor(t)
        with pytest.raises(zctipc.InvalidArgument, match="descriptor counts"):
            q.put(t, timeout=1)
        assert q.empty()
        q.put(f)  # the buffer's count was given back, and it goes still
        assert q.get(timeout=GET).tolist() == [7.0] * 4
    finally:
        q.close()
