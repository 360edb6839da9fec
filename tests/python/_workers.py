"""Functions that tests run in child processes (importable under spawn and
forkserver)."""

import hashlib
import os
import traceback

import numpy as np


def report(queue, fn, *args):
    """Run fn(*args) and put ("ok", result) or ("error", type name, message)."""
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # the parent asserts on it
        queue.put(("error", type(exc).__name__, str(exc), traceback.format_exc()))


def read_and_write_big(name):
    """Check the pattern the parent wrote into a big float32 tensor, write
    another one back, and return the sum of every element."""
    import zctipc

    with zctipc.attach_shared_tensor(name) as t:
        a = t.numpy()
        stride = 4096
        n = len(a[::stride])
        if not np.array_equal(a[::stride], np.arange(n, dtype=np.float32)):
            raise AssertionError("the parent's pattern is not there")
        if a[-1] != 42.0:
            raise AssertionError(f"last element is {a[-1]}")
        total = float(a.sum(dtype=np.float64))  # touches every page
        a[1::stride] = -np.arange(n, dtype=np.float32)
        del a
    return total


def digest_of(name):
    import zctipc

    with zctipc.attach_shared_tensor(name, readonly=True) as t:
        return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def create_hold_and_exit(name, ready, release):
    """Process A: create a tensor, say so, and exit once told to."""
    import zctipc

    t = zctipc.create_shared_tensor(name, data=np.arange(1 << 16, dtype=np.int32))
    ready.set()
    if not release.wait(60):
        raise TimeoutError("never released")
    t.close()


def hold_until(name, attached, release):
    """Attach a tensor, say so, and let go once told to."""
    import zctipc

    t = zctipc.attach_shared_tensor(name)
    attached.set()
    release.wait(60)
    t.close()


def call_zctipc():
    """Use zctipc; in a child forked after the library loaded this raises."""
    import zctipc

    zctipc.empty(4)
    return os.getpid()


def attach_twice(name):
    """Attach, let go, attach again: the mapping cache gives the same address."""
    import zctipc

    first = zctipc.attach_shared_tensor(name)
    address = first.numpy().ctypes.data
    first.close()
    second = zctipc.attach_shared_tensor(name)
    again = second.numpy().ctypes.data
    refcount = second.refcount
    second.close()
    return address == again, refcount
