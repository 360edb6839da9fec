"""The package builds as a wheel that carries the Go library and the cffi
extension, and installs and works from that wheel alone."""

import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_wheel_carries_the_native_parts_and_works(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path), ROOT],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
    assert wheel.startswith("zctipc-") and wheel.endswith("-cp310-abi3-linux_x86_64.whl"), (
        f"{wheel}: one platform wheel for CPython 3.10 and later (the extension uses the limited API)"
    )
    names = zipfile.ZipFile(tmp_path / wheel).namelist()
    assert "zctipc/libzctipc.so" in names
    assert "zctipc/zctipc.h" in names
    assert "zctipc/py.typed" in names, "the PEP 561 marker: type checkers read the package's annotations"
    assert any(n.startswith("zctipc/_zctipc_cffi") and n.endswith(".so") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the license travels with the wheel"

    # Installed alone into a fresh directory, it finds its library beside itself.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(tmp_path / wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import zctipc, numpy as np; t = zctipc.create_shared_tensor(data=np.arange(3)); "
        "print(zctipc.__file__, t.numpy().sum()); t.close()"
    )
    env = {k: v for k, v in os.environ.items() if k != "ZCTIPC_LIBRARY"}
    env["PYTHONPATH"] = str(target)
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=60
    )
    assert run.returncode == 0, run.stderr
    path, total = run.stdout.split()
    assert path.startswith(str(target)) and total == "3"
