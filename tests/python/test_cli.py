"""The command line: ``zctipc ls``, ``zctipc gc`` and ``zctipc doctor``, run
as a user runs them, in a segment and runtime directory of their own."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import SHM, daemon_pid

from zctipc import cli

BIN = os.path.dirname(sys.executable)


def zctipc(env, *args):
    """Run the ``zctipc`` console script; return its standard output."""
    out = subprocess.run([os.path.join(BIN, "zctipc"), *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def start(env, code):
    """A Python child running code, whose first line says it is ready."""
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def stop(p):
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()


HOLD_A_TENSOR = """
import time, numpy as np, zctipc
t = zctipc.create_shared_tensor("cli_demo", shape=(2, 3), dtype=np.float32)
print("ready", flush=True)
time.sleep(3600)
"""

# A process with no cleanup (no ledger, no daemon) that exits without letting
# go: what it made is an orphan only zctipc gc can find.
LEAVE_AN_ORPHAN = """
import os, numpy as np, zctipc
t = zctipc.create_shared_tensor("cli_orphan", data=np.arange(1000, dtype=np.int16))
os._exit(0)
"""


@pytest.mark.slow
def test_ls_shows_each_segment_and_who_holds_it(isolated):
    holder = start(isolated, HOLD_A_TENSOR)
    try:
        text = zctipc(isolated, "ls")
        line = next(ln for ln in text.splitlines() if "zctipc_cli_demo" in ln)
        assert "tensor" in line and "float32[2, 3]" in line
        assert f"{holder.pid} (alive)" in line
        assert re.search(rf"{holder.pid} \(alive\) +1 ", line), "one count, the creator's"
        assert any(" ledger " in ln for ln in text.splitlines()), "the holder's ledger is listed too"
        rows = json.loads(zctipc(isolated, "ls", "--json"))
        row = next(r for r in rows if r["name"] == "zctipc_cli_demo")
        assert (row["dtype"], row["shape"], row["creator_pid"], row["creator_alive"], row["refcount"]) == (
            "float32",
            [2, 3],
            holder.pid,
            True,
            1,
        )
        assert row["tracked"] and row["holders"] == [holder.pid]
    finally:
        stop(holder)
    assert daemon_pid(isolated["ZCTIPC_RUNTIME_DIR"]) is not None, "the holder started the daemon"
    gone = json.loads(zctipc(isolated, "ls", "--json"))
    deadline = time.monotonic() + 10
    while gone and time.monotonic() < deadline:
        time.sleep(0.05)
        gone = json.loads(zctipc(isolated, "ls", "--json"))
    assert gone == [], "the daemon swept the killed holder"


HOLD_A_QUEUE = """
import time, zctipc
q = zctipc.Queue()  # a ring of 1 GiB, sparse: a few pages in memory
print("ready", flush=True)
time.sleep(3600)
"""


def test_ls_shows_the_memory_segments_hold_not_their_apparent_size(isolated):
    holder = start(isolated, HOLD_A_QUEUE)
    try:
        rows = json.loads(zctipc(isolated, "ls", "--json"))
        ring = max(rows, key=lambda r: r["file_size"])
        assert ring["file_size"] >= 1 << 30 and 0 < ring["resident"] < 16 << 20, "sparse: the ring's pages come and go"
        text = zctipc(isolated, "ls")
        assert "RESIDENT" in text.splitlines()[0]
        total = text.strip().splitlines()[-1]
        assert re.fullmatch(r"\d+ segments?, [\d.]+ (B|KiB|MiB) in memory \([\d.]+ GiB apparent\)", total), total
    finally:
        stop(holder)


@pytest.mark.slow
def test_gc_removes_an_orphan_and_keeps_what_is_held(isolated):
    env = dict(isolated, ZCTIPC_CLEANUP="0")
    subprocess.run([sys.executable, "-c", LEAVE_AN_ORPHAN], env=env, check=True, timeout=60)
    holder = start(env, HOLD_A_TENSOR)
    try:
        shm = isolated["ZCTIPC_SHM_DIR"]
        assert sorted(os.listdir(shm)) == ["zctipc_cli_demo", "zctipc_cli_orphan"]
        dry = zctipc(isolated, "gc", "--dry-run")
        assert re.search(
            r"would remove zctipc_cli_orphan \(tensor, 2\.1 KiB\): no live holder "
            r"\(creator pid \d+ exited, refcount 1\)",
            dry,
        )
        assert "zctipc_cli_demo" not in dry
        assert sorted(os.listdir(shm)) == ["zctipc_cli_demo", "zctipc_cli_orphan"], "a dry run removes nothing"
        done = zctipc(isolated, "gc")
        assert "removed zctipc_cli_orphan (tensor, 2.1 KiB)" in done
        assert "removed 1 segment (2.1 KiB)" in done
        assert os.listdir(shm) == ["zctipc_cli_demo"], "the live holder's tensor stays"
        again = json.loads(zctipc(isolated, "gc", "--json"))
        assert again["removed"] == [] and again["ledgers"] == []
    finally:
        stop(holder)
    # The holder kept no ledger either: its tensor is an orphan now.
    zctipc(isolated, "gc")
    assert os.listdir(isolated["ZCTIPC_SHM_DIR"]) == []


def test_python_dash_m_is_the_same_command(isolated):
    out = subprocess.run(
        [sys.executable, "-m", "zctipc", "ls"], env=isolated, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"no zctipc segments in {isolated['ZCTIPC_SHM_DIR']}"


@pytest.mark.slow
def test_doctor_reports_the_machine(isolated):
    text = zctipc(isolated, "doctor")
    fields = dict(ln.split(":", 1) for ln in text.splitlines() if not ln.startswith("WARNING"))
    assert f"(C ABI {cli._native.ABI_VERSION})" in fields["libzctipc"]
    assert fields["shared memory"].strip().startswith(isolated["ZCTIPC_SHM_DIR"] + ":")
    assert "RLIMIT_NOFILE" in fields["open files limit"]
    assert "reserved" in fields["huge pages"]
    assert fields["huge pages for segments"].strip().startswith("no: ")  # the test's tmpfs is mounted huge=never
    assert fields["cleanup daemon"].strip().startswith("not running")
    assert fields["sharing strategy"].strip() == "file_system"
    assert daemon_pid(isolated["ZCTIPC_RUNTIME_DIR"]) is None, "looking starts no daemon"
    holder = start(isolated, HOLD_A_TENSOR)
    try:
        report = json.loads(zctipc(isolated, "doctor", "--json"))
        pid = daemon_pid(isolated["ZCTIPC_RUNTIME_DIR"])
        daemon = report["cleanup_daemon"]
        assert (daemon["running"], daemon["pid"], daemon["clients"]) == (True, pid, 1)
    finally:
        stop(holder)


def test_doctor_warns_of_a_small_dev_shm_and_a_low_open_files_limit(monkeypatch, capsys):
    small = os.statvfs_result((4096, 4096, 16384, 16000, 16000, 1000, 900, 900, 0, 255, 0))  # 64 MiB
    monkeypatch.setattr(cli.os, "statvfs", lambda path: small)
    monkeypatch.setattr(cli.resource, "getrlimit", lambda which: (1024, 4096))
    assert cli.main(["doctor"]) == 1, "a warning is a failing check"
    out = capsys.readouterr().out
    assert "64.0 MiB, 62.5 MiB free" in out
    assert f"WARNING: {cli._shm_dir()} holds only 64.0 MiB (Docker's default is 64 MB)" in out
    assert "--shm-size" in out
    assert "WARNING: the open-files limit is 1024" in out
    assert cli.main(["doctor", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and len(report["warnings"]) == 2


def test_a_healthy_machine_gets_no_warning(monkeypatch):
    big = os.statvfs_result((4096, 4096, 1 << 22, 1 << 21, 1 << 21, 1000, 900, 900, 0, 255, 0))  # 16 GiB
    monkeypatch.setattr(cli.os, "statvfs", lambda path: big)
    monkeypatch.setattr(cli.resource, "getrlimit", lambda which: (65536, 65536))
    assert cli._diagnose()["warnings"] == []


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"zctipc {cli._native.package_version()}"


def test_an_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["remove-everything"])
    assert exc.value.code == 2
    assert "invalid choice: 'remove-everything'" in capsys.readouterr().err


def test_ls_counts_no_memory_for_a_link_or_a_file_that_is_gone(tmp_path, capsys, monkeypatch):
    """A symbolic link with the library's prefix in the shm dir holds no
    memory there: ls counted the blocks of the file it points at (anywhere
    on the machine). A file that vanishes while ls lists is counted as none."""
    target = tmp_path / "elsewhere"
    target.write_bytes(os.urandom(1 << 16))
    link = os.path.join(SHM, f"zctipc_link_{uuid.uuid4().hex[:12]}")
    gone = os.path.join(SHM, f"zctipc_gone_{uuid.uuid4().hex[:12]}")
    os.symlink(target, link)
    with open(gone, "wb") as f:
        f.write(os.urandom(1 << 16))
    listed = cli.tensor.list_segments

    def list_then_remove():
        segments = listed()
        os.unlink(gone)  # removed between the listing and the look at its blocks
        return segments

    monkeypatch.setattr(cli.tensor, "list_segments", list_then_remove)
    try:
        assert cli.main(["ls", "--json"]) == 0
    finally:
        os.unlink(link)
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[os.path.basename(link)]["resident"] == 0
    assert rows[os.path.basename(gone)]["resident"] is None
