"""Files written by an older toolgraph (commit c89a4a5, before the layering refactor) still load
and rank exactly as they did then: a bi-encoder checkpoint, its exported folder, a BM25 folder.
The fixture is made by tests/fixtures/make_legacy.py."""

import json
import shutil
from pathlib import Path

import pytest

import toolgraph

LEGACY = Path(__file__).resolve().parent / "fixtures" / "legacy"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


@pytest.mark.parametrize("name", ["bi_encoder.ckpt", "bi_encoder_export", "bm25"])
def test_legacy_file_ranks_as_when_it_was_written(name, tmp_path):
    src = LEGACY / name
    dst = tmp_path / name  # loading may write caches beside the file: never into the fixture
    shutil.copy(src, dst) if src.is_file() else shutil.copytree(src, dst)
    ranking = toolgraph.load(dst).retrieve(EXPECTED["queries"], k=5)
    assert ranking.ids == EXPECTED[name]["ids"]
    got = [round(float(v), 6) for row in ranking.scores for v in row]
    assert got == pytest.approx([v for row in EXPECTED[name]["scores"] for v in row], abs=2e-6)
