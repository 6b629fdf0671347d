"""toolgraph doctor: what the machine has, the fix for what it lacks, exit 1 when a recipe would fail."""

import json

import pytest

from toolgraph import doctor
from toolgraph.cli import main


def test_doctor_on_this_machine_finds_everything(capsys, data_root):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "ok      all-MiniLM-L6-v2" in out and "toollens" in out and "everything toolgraph needs is here" in out
    assert main(["doctor", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    assert {c["name"] for c in checks} >= {"python", "torch", "lightning", "cpu", "data", "all-MiniLM-L6-v2"}
    assert all(c["status"] in ("ok", "warn") for c in checks)


@pytest.mark.parametrize("value", [None, "/nonexistent/benchmarks"])
def test_a_missing_data_folder_is_named_with_its_fix(monkeypatch, capsys, tmp_path, value):
    from toolgraph.data import loading

    monkeypatch.setattr(loading, "CHECKOUT_DATA", tmp_path / "shared" / "datasets")  # no ../shared either
    if value is None:
        monkeypatch.delenv("TOOLGRAPH_DATA", raising=False)
    else:
        monkeypatch.setenv("TOOLGRAPH_DATA", value)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("missing ") and " data " in x)
    assert ("not set" in line) if value is None else (value in line)
    assert "fix: " in out.split(line, 1)[1].splitlines()[1]  # the fix on the next line


def test_packages_are_checked_against_the_lock(monkeypatch, tmp_path, capsys):
    lock = tmp_path / "cpu.lock"
    lock.write_text("torch==0.0.1+cpu\n    # via toolgraph\nnumpy==" + doctor._version("numpy") + "\n")
    monkeypatch.setattr(doctor, "LOCK", lock)
    monkeypatch.setattr(doctor, "REQUIRED", [*doctor.REQUIRED, "no-such-package-xyz"])
    checks = {c.name: c for c in doctor.package_checks()}
    assert checks["torch"].status == "warn" and "the lock says 0.0.1+cpu" in checks["torch"].detail
    assert checks["numpy"].status == "ok" and checks["numpy"].detail.endswith("(locked)")
    assert checks["no-such-package-xyz"].status == "missing" and "make install" in checks["no-such-package-xyz"].fix
    monkeypatch.setattr(doctor, "diagnose", lambda: list(checks.values()))
    assert main(["doctor"]) == 1  # a required package missing
    assert "1 missing" in capsys.readouterr().out


def test_without_toolgraph_data_the_checkouts_shared_datasets_are_used_and_said(monkeypatch, tmp_path):
    """Unset TOOLGRAPH_DATA is fine beside a ../shared/datasets: every command finds it (data.loading.data_root),
    and doctor says it is that folder."""
    from toolgraph.data import loading

    shared = tmp_path / "shared" / "datasets"
    (shared / "toollens").mkdir(parents=True)
    (shared / "toollens" / "SOURCE.txt").write_text("test")
    monkeypatch.setattr(loading, "CHECKOUT_DATA", shared)
    monkeypatch.delenv("TOOLGRAPH_DATA", raising=False)
    [check] = doctor.data_checks()
    assert check.status == "ok" and check.detail.startswith(f"TOOLGRAPH_DATA unset: the checkout's ../shared/datasets, "
                                                              f"{shared}: 1 benchmark folders (toollens)")
    assert loading.data_root() == shared
