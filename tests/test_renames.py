"""Renamed config keys (config.py ``renamed`` tables): an old key in a YAML file, a saved dict or an
override loads to the same value as its new key; both in one source is an error naming both; a
plain string stands for a section with a shorthand (TextEncoderSpec: ``{name: <string>}``)."""

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from toolgraph import config as C
from toolgraph.config import TextEncoderSpec, accepts_renamed, encoder_spec, load_config, to_dict
from toolgraph.errors import ConfigError


@dataclass
class Inner:
    states_dir: str | None = ".cache/toolgraph"
    renamed: ClassVar[dict[str, str]] = {"cache_dir": "states_dir"}


@accepts_renamed
@dataclass
class Section:
    name: str = "toy"
    encoder: TextEncoderSpec = field(default_factory=encoder_spec(max_length=128))
    inner: Inner = field(default_factory=Inner)
    batch_size: int = 8
    renamed: ClassVar[dict[str, str]] = {"model": "encoder.name", "tool_prefix": "encoder.doc_prefix",
                                         "max_tool_length": "encoder.max_length", "bs": "batch_size"}


@accepts_renamed
@dataclass
class SubSection(Section):
    renamed: ClassVar[dict[str, str]] = {"embed_cache": "encoder.cache_dir"}


@dataclass
class Run:
    slot: Any = None
    seed: int = 0


@pytest.fixture
def slot(monkeypatch):
    classes = {"toy": Section, "sub": SubSection}
    monkeypatch.setitem(C.POLYMORPHIC, "slot", ("toy", lambda name: classes[name](name=name)))


OLD = {"model": "m1", "tool_prefix": "doc: ", "max_tool_length": 64, "bs": 4, "inner": {"cache_dir": "acts"}}
NEW = {"encoder": {"name": "m1", "doc_prefix": "doc: ", "max_length": 64}, "batch_size": 4,
       "inner": {"states_dir": "acts"}}


def test_old_keys_load_like_new_ones_from_every_source(tmp_path):
    want = load_config(Section, [NEW])
    assert want.encoder == TextEncoderSpec(name="m1", doc_prefix="doc: ", max_length=64)
    assert load_config(Section, [OLD]) == want  # a saved dict
    f = tmp_path / "old.yaml"
    f.write_text("model: m1\ntool_prefix: 'doc: '\nmax_tool_length: 64\nbs: 4\ninner:\n  cache_dir: acts\n")
    assert load_config(Section, [f]) == want  # a YAML file
    overrides = ["model=m1", "tool_prefix='doc: '", "max_tool_length=64", "--bs=4", "inner.cache_dir=acts"]
    assert load_config(Section, [], overrides) == want  # overrides
    assert to_dict(load_config(Section, [OLD])) == to_dict(want)  # saved again: new keys only
    assert "model" not in to_dict(want) and "states_dir" in to_dict(want)["inner"]


def test_open_slot_uses_the_table_of_the_class_its_name_picks(slot, tmp_path):
    old = load_config(Run, [{"slot": {"name": "sub", "model": "m2", "embed_cache": None}}])
    assert type(old.slot) is SubSection
    assert old.slot.encoder == TextEncoderSpec(name="m2", max_length=128, cache_dir=None)  # inherited + own entries
    # the name in a later source picks the class whose table applies to every source
    f = tmp_path / "preset.yaml"
    f.write_text("slot:\n  embed_cache: null\n")
    got = load_config(Run, [f], ["slot.name=sub", "slot.model=m2"])
    assert got == old


def test_a_source_with_the_old_and_the_new_key_is_an_error_naming_both(slot):
    with pytest.raises(ConfigError, match=r"'model' and 'encoder.name'.*keep only 'encoder.name'"):
        load_config(Section, [{"model": "a", "encoder": {"name": "b"}}])
    with pytest.raises(ConfigError, match=r"'model' and 'encoder.name'"):
        load_config(Section, [{"model": "a", "encoder": "b"}])  # the shorthand sets encoder.name too
    with pytest.raises(ConfigError, match=r"override .*'slot.inner.cache_dir' and 'slot.inner.states_dir'"):
        load_config(Run, [], ["slot.inner={cache_dir: a, states_dir: b}"])
    with pytest.raises(ConfigError, match=r"'bs' and 'batch_size'"):
        load_config(Section, [{"bs": 1, "batch_size": 2}])
    # across sources it is no conflict: the later source wins, whichever name it uses
    assert load_config(Section, [{"encoder": {"name": "b"}}, {"model": "a"}]).encoder.name == "a"
    assert load_config(Section, [{"model": "a"}, {"encoder": "b"}]).encoder.name == "b"


def test_a_plain_string_is_the_encoder_name_over_the_sections_defaults(tmp_path):
    got = load_config(Section, [{"encoder": {"name": "x", "query_prefix": "q: "}}], ["encoder=y"])
    assert got.encoder == TextEncoderSpec(name="y", query_prefix="q: ", max_length=128)
    # old encoder-as-a-string sections (graph node text) keep loading with their old length keys
    assert load_config(Section, [{"encoder": "z", "max_tool_length": 32}]).encoder.max_length == 32
    with pytest.raises(ConfigError, match="encoder.max_length"):
        load_config(Section, [{"encoder": {"max_length": 0}}])


def test_code_may_use_the_old_keyword_names():
    assert Section(model="m1", tool_prefix="doc: ", max_tool_length=64, bs=4) == load_config(
        Section, [{k: v for k, v in OLD.items() if k != "inner"}])
    assert Section(encoder="e").encoder == TextEncoderSpec(name="e", max_length=128)
    assert Section(encoder="e", max_tool_length=9).encoder.max_length == 9
    assert SubSection(embed_cache=None, model="m").encoder == TextEncoderSpec(name="m", max_length=128, cache_dir=None)
    with pytest.raises(ConfigError, match="given twice"):
        Section(encoder={"name": "a"}, model="b")
    with pytest.raises(ConfigError, match="not both"):
        Section(encoder=TextEncoderSpec(), model="b")


def test_an_inline_retriever_takes_old_keys_over_new_ones_from_another_source(tmp_path):
    from toolgraph.config import EvaluateConfig

    f = tmp_path / "t2a.yaml"
    f.write_text("retriever:\n  name: t2a\n  dense: {name: dense, encoder: {name: a, cache_dir: .cache}}\n")
    cfg = load_config(EvaluateConfig, [f], ["retriever.dense.model=b", "retriever.dense.cache_dir=null"])
    assert cfg.retriever.dense == {"name": "dense", "encoder": {"name": "b", "cache_dir": None}}
    # old keys in the file, new ones in the override: the override wins, no "both set"
    f.write_text("retriever:\n  name: t2a\n  dense: {name: dense, model: a, max_length: 128}\n")
    cfg = load_config(EvaluateConfig, [f], ["retriever.dense.encoder.name=b"])
    assert cfg.retriever.dense == {"name": "dense", "encoder": {"name": "b", "max_length": 128}}


def test_task_sections_take_the_spec_its_shorthands_and_refuse_keys_they_do_not_read():
    from toolgraph.config import TrainConfig

    cfg = load_config(TrainConfig, [], ["model.name=refiner", "model.first_stage=runs/mlc", "model.vectors=description",
                                        "model.vectors.encoder=runs/bi/retriever/encoder"])
    m = cfg.model
    assert (m.first_stage.source, m.vectors.kind, m.vectors.encoder.name) == ("runs/mlc", "description",
                                                                               "runs/bi/retriever/encoder")
    assert m.vector_encoder == "runs/bi/retriever/encoder"  # code's old attribute name reads the new key
    for task, key in [("bi_encoder", "max_length"), ("mlc", "query_prefix"), ("refiner", "pooling"),
                      ("graph", "doc_prefix"), ("discriminator", "cache_dir")]:
        with pytest.raises(ConfigError, match=rf"model\.encoder\.{key}.*not read"):
            load_config(TrainConfig, [], [f"model.name={task}", f"model.encoder.{key}=x" if "prefix" in key
                                          else f"model.encoder.{key}={'cls' if key == 'pooling' else 64}"])
    # what each task does read
    bi = load_config(TrainConfig, [], ["model.name=bi_encoder", "model.encoder.pooling=cls", "model.tool_prefix='t: '"])
    assert (bi.model.encoder.pooling, bi.model.encoder.doc_prefix) == ("cls", "t: ")
    g = load_config(TrainConfig, [], ["model.name=graph", "model.encoder.cache_dir=null"])
    assert g.model.encoder.cache_dir is None


def test_an_old_key_override_reaches_a_pipelines_inline_first_stage():
    """retriever.first_stage.model=x (the old key) merges into an inline first stage written with the new
    keys (PipelineConfig.retriever_slots), as it does for an agent index's dense member."""
    from toolgraph.config import EvaluateConfig, load_config

    base = {"retriever": {"name": "pipeline", "reranker": "bm25",
                          "first_stage": {"name": "dense", "encoder": {"name": "a", "pooling": "cls"}}}}
    cfg = load_config(EvaluateConfig, [base], ["retriever.first_stage.model=b"])
    assert cfg.retriever.first_stage["encoder"] == {"name": "b", "pooling": "cls"}
