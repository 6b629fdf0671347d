"""Loading a checkpoint never writes outside the folder toolgraph chose (issue 20, finding 1).

A checkpoint carries its tokenizer files as name -> text; before the fix, a name such as
``../x`` or ``/abs/path`` was written wherever it pointed (a write-anything primitive that passed
``weights_only`` loading). Built from the legacy fixture, so the checkpoint is otherwise valid."""

import tempfile
import uuid
from pathlib import Path

import pytest
import torch

import toolgraph
from toolgraph.errors import DataError
from toolgraph.nn.encoder import plain_file_name

LEGACY_CKPT = Path(__file__).resolve().parent / "fixtures" / "legacy" / "bi_encoder.ckpt"


def _tampered(tmp_path: Path, name: str) -> Path:
    ckpt = torch.load(LEGACY_CKPT, map_location="cpu", weights_only=True)
    ckpt["toolgraph"]["artifacts"]["query"]["tokenizer_files"][name] = "written by a hostile checkpoint\n"
    out = tmp_path / "tampered.ckpt"
    torch.save(ckpt, out)
    return out


@pytest.mark.parametrize("kind", ["parent", "absolute", "nested"])
def test_checkpoint_cannot_write_outside_its_temp_folder(kind, tmp_path):
    unique = f"toolgraph-pwned-{uuid.uuid4().hex}.pth"
    target = {"parent": Path(tempfile.gettempdir()) / unique,
              "absolute": tmp_path / unique,
              "nested": None}[kind]
    name = {"parent": f"../{unique}", "absolute": str(target), "nested": f"sub/{unique}"}[kind]
    with pytest.raises(DataError, match="not a plain file name") as err:
        toolgraph.load(_tampered(tmp_path, name))
    assert "tampered.ckpt" in str(err.value)  # the error names the file
    if target is not None:
        assert not target.exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\\b", "/etc/passwd", "x\0y", 7])
def test_plain_file_name_refuses_paths(name):
    with pytest.raises(DataError):
        plain_file_name(name, "test")


def test_plain_names_still_load(tmp_path):
    ranking = toolgraph.load(_tampered(tmp_path, "extra_notes.txt")).retrieve(["please tell me the weather"], 3)
    assert len(ranking.ids[0]) == 3
