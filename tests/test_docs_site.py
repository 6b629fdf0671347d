"""The documentation site (mkdocs.yml): `mkdocs build --strict` passes, and would fail on a broken link."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("mkdocs", reason="the docs extra is not installed (make install installs it)")


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(out)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})


def test_the_site_builds_strict_with_the_readme_and_the_api_reference(tmp_path):
    run = build(ROOT, tmp_path / "site")
    assert run.returncode == 0, run.stderr[-3000:]
    readme = (tmp_path / "site" / "readme" / "index.html").read_text()
    assert 'href="../getting-started/"' in readme  # README's docs/ links point at the site's pages
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "toolgraph.retrieval.loading.load" in api and "write_cards" in api  # from the docstrings


def test_a_broken_link_fails_the_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    shutil.copy(ROOT / "README.md", copy / "README.md")
    shutil.copytree(ROOT / "toolgraph", copy / "toolgraph", ignore=shutil.ignore_patterns("__pycache__"))
    page = copy / "docs" / "metrics.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    run = build(copy, tmp_path / "site")
    assert run.returncode != 0 and "no-such-page.md" in run.stderr
