"""Issue 20, finding 8: a missing tokenizer must not rank every query as [UNK] with exit 0, and a
vectors file with fewer rows than tools must not load. Both fail at load with a DataError naming
the folder or file and the counts, with or without a manifest (folders from older versions)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from saved_retrievers import KINDS, QUERIES, TOOLS, VECTOR_FILES, build

import toolgraph
from toolgraph.errors import ConfigError, DataError

TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def _drop_manifests(folder: Path) -> None:
    """As a folder written before manifests existed: only the load-time checks remain."""
    for m in folder.rglob("manifest.json"):
        m.unlink()


@pytest.fixture
def model_without_tokenizer(tiny_bert_dir, tmp_path) -> Path:
    """A model folder whose tokenizer files were not copied (config and weights only)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, folder)
    for name in TOKENIZER:
        (folder / name).unlink(missing_ok=True)
    return folder


def test_encoder_folder_without_tokenizer_fails_to_load(model_without_tokenizer):
    from toolgraph.nn.encoder import load_backbone

    with pytest.raises(DataError, match=r"model: no tokenizer files .*default \d+-token vocabulary for a model of "
                                        r"30522 tokens.*copy the tokenizer files"):
        load_backbone(str(model_without_tokenizer))


def test_dense_retriever_on_a_model_without_tokenizer_fails_instead_of_ranking_unk(model_without_tokenizer):
    """The issue's case: a dense retriever named by a folder whose tokenizer files are missing."""
    from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

    r = DenseRetriever(DenseConfig(model=str(model_without_tokenizer), cache_dir=None, progress=False))
    with pytest.raises(DataError, match="no tokenizer files"):
        r.index(TOOLS)


@pytest.mark.parametrize("manifest", [True, False], ids=["with-manifest", "older-folder"])
def test_saved_retriever_whose_encoder_lost_its_tokenizer_fails_at_load(tiny_bert_dir, tmp_path, manifest):
    folder = build("dense", tiny_bert_dir).save(tmp_path / "dense")
    if not manifest:
        _drop_manifests(folder)
    for name in TOKENIZER:
        (folder / "encoder" / name).unlink(missing_ok=True)
    expected = r"encoder/tokenizer\.json: missing" if manifest else r"encoder: no tokenizer files"
    with pytest.raises(DataError, match=expected):
        toolgraph.load(folder)


def test_tokenizer_of_another_model_fails_to_load(tiny_bert_dir, tmp_path):
    """A tokenizer of 30522 tokens over a model with 100000 embedding rows (or the reverse)."""
    from toolgraph.nn.encoder import load_backbone

    folder = tmp_path / "mixed"
    shutil.copytree(tiny_bert_dir, folder)
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1000}))
    with pytest.raises(DataError, match=r"mixed: the tokenizer has 30522 tokens but the model's embedding has 1000 "
                                        r"rows: the tokenizer and the weights come from different models"):
        load_backbone(str(folder))


def test_checkpoint_without_tokenizer_files_fails_to_load(tiny_bert_dir):
    from toolgraph.nn.encoder import backbone_artifacts, backbone_from_artifacts, load_backbone

    art = backbone_artifacts(*load_backbone(str(tiny_bert_dir)))
    assert backbone_from_artifacts(art)[1] is not None
    art["tokenizer_files"] = {k: v for k, v in art["tokenizer_files"].items() if k == "tokenizer_config.json"}
    with pytest.raises(DataError, match=r"checkpoint artifacts: tokenizer_files: no tokenizer files"):
        backbone_from_artifacts(art)


@pytest.mark.parametrize("kind", KINDS)
def test_fewer_vectors_than_tools_fails_naming_the_file_and_both_counts(kind, tiny_bert_dir, tmp_path):
    """E.g. tool_vectors.safetensors with 5 rows for 6 tools: 1 tool could never be returned."""
    folder = build(kind, tiny_bert_dir).save(tmp_path / kind)
    _drop_manifests(folder)  # an older folder, or one damaged along with its manifest
    name, key = VECTOR_FILES[kind]
    path = folder / name
    tensors = load_file(str(path))
    rows = tensors[key].shape[0]
    tensors[key] = tensors[key][: rows - 1].clone()
    if kind == "mlc":
        tensors["bias"] = tensors["bias"][: rows - 1].clone()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    with pytest.raises(DataError) as e:
        toolgraph.load(folder).retrieve(QUERIES, 3)
    msg = str(e.value)
    assert name.split("/")[-1] in msg and str(rows - 1) in msg and str(rows) in msg, msg


def test_more_vectors_than_tools_fails_too(tiny_bert_dir, tmp_path):
    folder = build("dense", tiny_bert_dir).save(tmp_path / "dense")
    _drop_manifests(folder)
    lines = (folder / "tools.jsonl").read_text().splitlines(keepends=True)
    (folder / "tools.jsonl").write_text("".join(lines[:-1]))
    meta = json.loads((folder / "retriever.json").read_text())
    (folder / "retriever.json").write_text(json.dumps({**meta, "tools": len(lines) - 1}))
    with pytest.raises(DataError, match=r"tool_vectors\.safetensors: tool_vectors has 6 rows \(shape \[6, 32\]\) for 5 tools"):
        toolgraph.load(folder)


def test_damaged_vectors_file_is_named(tiny_bert_dir, tmp_path):
    folder = build("dense", tiny_bert_dir).save(tmp_path / "dense")
    _drop_manifests(folder)
    path = folder / "tool_vectors.safetensors"
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(DataError, match=r"tool_vectors\.safetensors: not a valid safetensors file"):
        toolgraph.load(folder)


def test_intact_folders_of_every_kind_still_load(tiny_bert_dir, tmp_path):
    for kind in KINDS:
        r = build(kind, tiny_bert_dir)
        back = toolgraph.load(r.save(tmp_path / kind))
        assert back.retrieve(QUERIES, 3).ids == r.retrieve(QUERIES, 3).ids, kind
        assert torch.allclose(back.retrieve(QUERIES, 3).scores, r.retrieve(QUERIES, 3).scores, atol=1e-6), kind


@pytest.mark.parametrize("damage", ["drop_weight", "drop_section"])
def test_damaged_checkpoint_is_a_data_error_naming_it(tmp_path, damage):
    """Weak case of the issue: a checkpoint whose weights do not fit its config was a raw RuntimeError."""
    from toolgraph.retrieval.loading import load_task

    legacy = Path(__file__).resolve().parent / "fixtures" / "legacy" / "bi_encoder.ckpt"
    ckpt = torch.load(legacy, map_location="cpu", weights_only=True)
    if damage == "drop_weight":
        ckpt["state_dict"].pop(next(iter(ckpt["state_dict"])))
        match = r"bad\.ckpt: the weights do not fit the bi_encoder model"
    else:
        del ckpt["hyper_parameters"]["config"]
        match = r"bad\.ckpt: incomplete toolgraph checkpoint"
    torch.save(ckpt, tmp_path / "bad.ckpt")
    with pytest.raises(DataError, match=match):
        load_task(tmp_path / "bad.ckpt")


@pytest.mark.parametrize("text,error,match", [
    ("{half", DataError, r"retriever\.json:1: malformed JSON"),
    ('["bm25"]', DataError, r"retriever\.json: expected \{\"retriever\""),
    ('{"retriever": "nope", "config": {}, "tools": 6}', ConfigError, r"retriever\.json: retriever: unknown retriever 'nope'"),
])
def test_corrupt_retriever_json_is_named(tmp_path, text, error, match):
    """Weak case of the issue: a corrupt retriever.json was a raw JSONDecodeError / KeyError."""
    from toolgraph.retrieval.loading import resolve_retriever

    r = resolve_retriever({"name": "bm25"}, "r")
    r.index(TOOLS)
    folder = r.save(tmp_path / "bm25")
    _drop_manifests(folder)
    (folder / "retriever.json").write_text(text)
    with pytest.raises(error, match=match):
        toolgraph.load(folder)


def test_bad_tools_line_is_named(tmp_path):
    from toolgraph.retrieval.loading import resolve_retriever

    r = resolve_retriever({"name": "bm25"}, "r")
    r.index(TOOLS)
    folder = r.save(tmp_path / "bm25")
    _drop_manifests(folder)
    lines = (folder / "tools.jsonl").read_text().splitlines()
    lines[2] = json.dumps({"id": "t3", "name": "x", "description": "y", "colour": "red"})
    (folder / "tools.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"tools\.jsonl:3: not a tool record"):
        toolgraph.load(folder)
