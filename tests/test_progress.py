"""Long steps show a progress bar with an ETA on stderr, and TQDM_DISABLE=1 silences every bar."""

import re

import pytest

from toolgraph.cli import main
from toolgraph.config import TrainConfig, load_config
from toolgraph.retrieval.progress import batches, progress_enabled

# tqdm's "[elapsed<remaining, rate]": remaining is "?" until a rate is known, then mm:ss
BAR = re.compile(r"(?P<label>[\w ,()]+):\s+\d+%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) \[\d\d:\d\d<(?P<eta>\?|\d\d:\d\d)")


def bars(err: str) -> list[dict[str, str]]:
    """Every frame of every bar written to ``err`` (frames end with \\r or \\n)."""
    return [m.groupdict() for m in BAR.finditer(err)]


def test_bm25_evaluation_shows_indexing_and_ranking_bars_with_an_eta(tiny_dataset_dir, tmp_path, capsys):
    rc = main(["evaluate", f"data.name={tiny_dataset_dir}", "retriever.name=bm25", "eval.ks=[1,3]",
               "eval.batch_size=1", "--out", str(tmp_path / "out")])
    assert rc == 0
    frames = bars(capsys.readouterr().err)
    ranking = [f for f in frames if f["label"] == "ranking test"]
    assert ranking[0] == {"label": "ranking test", "n": "0", "total": "3", "eta": "?"}, frames
    assert ranking[-1] == {"label": "ranking test", "n": "3", "total": "3", "eta": "00:00"}, frames  # left on screen
    assert any(f["label"].startswith("BM25S") for f in frames), frames  # bm25s indexing the catalog


def test_dense_evaluation_shows_encoding_bars(tiny_dataset_dir, tiny_bert_dir, capsys):
    rc = main(["evaluate", f"data.name={tiny_dataset_dir}", "retriever.name=dense", f"retriever.model={tiny_bert_dir}",
               "retriever.cache_dir=null", "retriever.batch_size=2", "eval.ks=[1,3]"])
    assert rc == 0
    labels = {f["label"] for f in bars(capsys.readouterr().err)}
    assert {"encoding tools", "encoding queries", "ranking test"} <= labels, labels


def test_tqdm_disable_silences_every_bar(tiny_dataset_dir, tiny_bert_dir, monkeypatch, capsys):
    monkeypatch.setenv("TQDM_DISABLE", "1")  # read when a bar starts, not only when tqdm is imported
    for retriever in (["retriever.name=bm25"], ["retriever.name=dense", f"retriever.model={tiny_bert_dir}",
                                                 "retriever.cache_dir=null"]):
        assert main(["evaluate", f"data.name={tiny_dataset_dir}", "eval.ks=[1,3]", *retriever]) == 0
    out = capsys.readouterr()
    assert "recall@1" in out.out and out.err == ""


@pytest.mark.parametrize(("value", "on"), [(None, True), ("", True), ("0", True), ("false", True), ("1", False),
                                           ("True", False)])
def test_the_switch(value, on, monkeypatch, capsys):
    if value is None:
        monkeypatch.delenv("TQDM_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TQDM_DISABLE", value)
    assert progress_enabled() is on and progress_enabled(False) is False
    assert [(s.start, s.stop) for s in batches(5, 2, "items")] == [(0, 2), (2, 4), (4, 6)]
    assert ("items: 100%" in capsys.readouterr().err) is on


def test_lightning_progress_bar_follows_the_switch(tmp_path, monkeypatch):
    from toolgraph.training import build_trainer

    cfg = load_config(TrainConfig, [{"model": {"name": "bi_encoder"}}], ["trainer.accelerator=cpu", "logger.wandb=false"])
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    assert build_trainer(cfg, tmp_path).progress_bar_callback is not None  # fit, validation, test, predict bars
    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert build_trainer(cfg, tmp_path).progress_bar_callback is None
