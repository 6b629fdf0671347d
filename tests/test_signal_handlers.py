"""SIGTERM stops the test run (issue 43, item 12): a test that runs a toolgraph command in this process
installs the project's signal handlers (toolgraph.runs.install_signal_handlers, which turn SIGTERM into
a ``Terminated`` exception); conftest's fixture puts the previous handlers back after every test and
stops the session (exit 143) when a test got a SIGTERM through them, so `make test` is never left
running with SIGTERM turned into one failed test."""

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolgraph.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
AT_START = signal.getsignal(signal.SIGTERM)  # read at collection, before any test of the session ran
# SIGINT's handler then: Python's default, or SIG_IGN when the run was started in the background by a shell
INT_AT_START = signal.getsignal(signal.SIGINT)


def test_a_command_run_in_this_process_puts_the_callers_handlers_back(tmp_path, capsys):
    """``toolgraph.cli.main`` installs the project's handlers while it runs and puts back the ones it found
    (a module-scoped fixture that trains through it cannot leave them behind for the rest of the session)."""
    from toolgraph.runs import _on_signal

    seen = []

    def mine(signum, frame):  # the caller's own handler
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, mine)
    try:
        assert cli(["index", "sync", str(tmp_path / "none.json"), "--index", str(tmp_path / "idx")]) == 2
        assert "catalog not found" in capsys.readouterr().err
        assert signal.getsignal(signal.SIGTERM) is mine and signal.getsignal(signal.SIGTERM) is not _on_signal
        assert cli(["data", "list"]) == 0  # a command that succeeds, too
        assert signal.getsignal(signal.SIGTERM) is mine
        assert signal.getsignal(signal.SIGINT) is INT_AT_START
    finally:
        signal.signal(signal.SIGTERM, before)


def test_after_such_a_test_sigterm_has_its_handler_of_before():
    assert signal.getsignal(signal.SIGTERM) is AT_START
    assert signal.getsignal(signal.SIGINT) is INT_AT_START


INNER = '''
import time
from pathlib import Path

from toolgraph.cli import main as cli

MARKS = Path(__file__).parent / "marks"


def test_1_runs_a_command_in_process(tmp_path):
    assert cli(["index", "sync", str(tmp_path / "none.json"), "--index", str(tmp_path / "idx")]) == 2
    (MARKS / "1").touch()


def test_2_is_running_when_sigterm_comes():
    if MODE == "during":  # a command still running (its handlers installed) when the signal comes
        from toolgraph.runs import install_signal_handlers

        install_signal_handlers()
    (MARKS / "2").touch()
    time.sleep(120)


def test_3_must_not_run():
    (MARKS / "3").touch()
'''


@pytest.mark.parametrize("mode", ["between", "during"])
def test_sigterm_stops_a_pytest_run_that_ran_a_command_in_process(tmp_path, mode):
    """A real pytest process (this repo's conftest): SIGTERM while test 2 runs, after test 1 ran a
    command in-process ("between"), or while a command's handlers are installed ("during"): the run
    stops there; test 3 never runs."""
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(f"MODE = {mode!r}\n" + INNER)
    (tmp_path / "marks").mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "marks" / "2").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - t0 < 30
    assert (tmp_path / "marks" / "1").exists() and not (tmp_path / "marks" / "3").exists(), out[-3000:]
    assert proc.returncode in (-signal.SIGTERM, 143), (proc.returncode, out[-3000:])
