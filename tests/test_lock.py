"""The lock file (requirements/cpu.lock): what `make install` installs, exactly."""

import re
from importlib import metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements" / "cpu.lock"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    for n, line in enumerate(LOCK.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line.strip())
        assert m, f"{LOCK}:{n}: not an exact pin: {line!r}"
        pins[_norm(m[1])] = m[2]
    return pins


def test_every_dependency_of_pyproject_is_locked_and_torch_is_the_cpu_build():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"] + \
        project["optional-dependencies"]["minilm"]
    pins = locked()
    names = {_norm(re.match(r"[A-Za-z0-9_.\-]+", r)[0]) for r in wanted}
    assert names <= pins.keys(), sorted(names - pins.keys())
    assert pins["torch"].endswith("+cpu") and not any(n.startswith("nvidia-") for n in pins)


def test_the_environment_holds_exactly_the_locked_versions():
    """A fresh clone's `make install` installs the lock: every locked package at its locked version
    (`pip freeze` equals the lock for the locked packages)."""
    installed = {_norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    drift = {n: (v, installed.get(n)) for n, v in locked().items() if installed.get(n) != v}
    assert not drift, f"installed versions differ from {LOCK.name} (locked, installed): {drift}; run `make install`"
