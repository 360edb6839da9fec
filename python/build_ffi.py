"""The cffi builder of zctipc's bindings (API mode, out of line).

setup.py runs it through ``cffi_modules``; it declares the functions between
the CDEF markers of the hand-written go/capi/zctipc.h and compiles the
extension ``zctipc._zctipc_cffi``, which links against libzctipc.so and finds
it next to itself ($ORIGIN) once installed.
"""

import os
import re

from cffi import FFI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER_DIR = os.path.join(ROOT, "go", "capi")
# Where setup.py has just built libzctipc.so.
LIB_DIR = os.environ.get("ZCTIPC_LIB_DIR", os.path.join(ROOT, "build", "lib"))


HEADER = os.path.join(HEADER_DIR, "zctipc.h")


def cdef_source(path=HEADER):
    with open(path) as f:
        text = f.read()
    match = re.search(r"/\* BEGIN CDEF[^*]*\*/(.*)/\* END CDEF \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{path} has no BEGIN CDEF ... END CDEF section")
    return match.group(1)


ffibuilder = FFI()
ffibuilder.cdef(cdef_source())
ffibuilder.set_source(
    "zctipc._zctipc_cffi",
    '#include "zctipc.h"',
    include_dirs=[HEADER_DIR],
    libraries=["zctipc"],
    library_dirs=[LIB_DIR],
    extra_link_args=["-Wl,-rpath,$ORIGIN", "-s"],  # no symbols or debug info in the wheel
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
