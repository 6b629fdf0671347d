"""The index lock file `.NAME.lock` lives only while a sync holds it, and removing it never lets two
syncs in at once (issue 43, item 10)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from toolgraph.errors import ConfigError
from toolgraph.sync import index_lock, sync_index

REPO = Path(__file__).resolve().parents[1]


def dot_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_the_lock_file_is_gone_after_a_sync_and_after_a_failed_one(mcp_catalog, tmp_path):
    index = tmp_path / "idx"
    sync_index(mcp_catalog[0], index, "bm25")
    assert dot_files(tmp_path) == []
    with pytest.raises(ConfigError, match="trained retriever"):  # fails under the lock (a new index)
        sync_index(mcp_catalog[0], tmp_path / "other", {"name": "mlc"})
    with index_lock(index) as lock:
        assert lock.is_file() and lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(RuntimeError, match="boom"), index_lock(tmp_path / "third"):
            raise RuntimeError("boom")
    assert dot_files(tmp_path) == []


def test_many_lockers_never_overlap_while_the_file_comes_and_goes(tmp_path):
    """Each holder removes the file before it lets go; a waiter then holds the lock of a file nobody can
    find, and a newcomer creates a new one. Without the check that the path still names the locked
    file, the waiter and the newcomer would both get in."""
    index = tmp_path / "idx"
    inside, overlaps, entries = [0], [], [0]
    guard = threading.Lock()

    def worker() -> None:
        for _ in range(15):
            with index_lock(index, wait=60):
                with guard:
                    inside[0] += 1
                    entries[0] += 1
                    if inside[0] > 1:
                        overlaps.append(inside[0])
                time.sleep(0.002)
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert entries[0] == 90 and not overlaps
    assert dot_files(tmp_path) == []


HOLD = """
import sys, time
from toolgraph.sync import index_lock
with index_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_lock_file_left_by_kill_9_is_reused_and_then_removed(mcp_catalog, tmp_path):
    index = tmp_path / "idx"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(index)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        proc.send_signal(signal.SIGKILL)  # no finally runs: the file stays, the kernel drops the lock
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert dot_files(tmp_path) == [".idx.lock"]
    assert sync_index(mcp_catalog[0], index, "bm25", wait=0)["created"]  # not waited for: it is free
    assert dot_files(tmp_path) == []
