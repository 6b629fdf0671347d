"""The lock file (requirements/cpu.lock): what `make install` installs, exactly."""

import re
from importlib import metadata
from pathlib import Path

import pytest

from toolgraph.doctor import normalize, read_lock
from toolgraph.errors import DataError

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "cpu.lock"


def locked() -> dict[str, str]:
    return read_lock(LOCK)


def test_every_dependency_of_pyproject_is_locked_and_torch_is_the_cpu_build():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + [r for extra in ("test", "minilm", "docs")
                                        for r in project["optional-dependencies"][extra]]
    pins = locked()
    names = {normalize(re.match(r"[A-Za-z0-9_.\-]+", r)[0]) for r in wanted}
    assert names <= pins.keys(), sorted(names - pins.keys())
    assert pins["torch"].endswith("+cpu") and not any(n.startswith("nvidia-") for n in pins)


def test_the_environment_holds_exactly_the_locked_versions():
    """A fresh clone's `make install` installs the lock: every locked package at its locked version
    (`pip freeze` equals the lock for the locked packages)."""
    installed = {normalize(d.metadata["Name"]): d.version for d in metadata.distributions()}
    drift = {n: (v, installed.get(n)) for n, v in locked().items() if installed.get(n) != v}
    assert not drift, f"installed versions differ from {LOCK.name} (locked, installed): {drift}; run `make install`"


def test_a_bad_lock_line_is_named(tmp_path):
    lock = tmp_path / "cpu.lock"
    lock.write_text("# header\ntorch==2.13.0+cpu\n    # via x\nnumpy>=2\n")
    with pytest.raises(DataError, match=r"line 4: not an exact pin.*numpy>=2"):
        read_lock(lock)
