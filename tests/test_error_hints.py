"""Errors a newcomer meets in the first hour say what to do: a missing path with the close names, a run
folder without its export, a dataset typo with "did you mean", a value of the wrong shape in the user's terms."""

import pytest

from toolgraph.cli import main as cli
from toolgraph.config import EvaluateConfig, load_config
from toolgraph.errors import ConfigError, DataError
from toolgraph.retrieval.loading import load


def test_a_missing_path_names_the_close_folders_beside_it(tmp_path):
    (tmp_path / "bi_encoder_toollens").mkdir()
    with pytest.raises(DataError, match=r"no such file or folder; did you mean .*bi_encoder_toollens\?") as e:
        load(tmp_path / "bi_encoder_toolens")
    assert e.value.path == str(tmp_path / "bi_encoder_toolens")
    with pytest.raises(DataError, match=r"no such file or folder; give a \.ckpt, a saved retriever folder or a run"):
        load(tmp_path / "unrelated")
    with pytest.raises(DataError, match=r"no such file or folder \(nor .*nowhere/\)"):
        load(tmp_path / "nowhere" / "x")


def test_a_run_folder_without_its_export_points_at_its_best_checkpoint(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("last.ckpt", "best-0-40.ckpt"):
        (run / "checkpoints" / name).write_bytes(b"")
    with pytest.raises(DataError, match=r"no exported retriever/ yet .* e\.g\. .*checkpoints/best-0-40\.ckpt"):
        load(run)
    (tmp_path / "plain").mkdir()
    with pytest.raises(DataError, match=r"not a checkpoint \(\.ckpt\), a saved retriever"):
        load(tmp_path / "plain")


def test_a_dataset_typo_gets_did_you_mean(capsys):
    assert cli(["evaluate", "retriever.name=bm25", "data.name=toollense", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'toollense' (did you mean 'toollens'" in err and "; known: api-bank" in err, err
    with pytest.raises(ConfigError, match=r"unknown retriever 'bm52' \(did you mean 'bm25'\?\); known: "):
        load_config(EvaluateConfig, [], ["retriever.name=bm52"])
    with pytest.raises(ConfigError, match=r"unknown retriever 'zzzz'; known: "):  # nothing close: no guess
        load_config(EvaluateConfig, [], ["retriever.name=zzzz"])


@pytest.mark.parametrize("value, shown", [("five", "'five'"), ("5", "5")])
def test_a_scalar_for_a_list_says_what_the_key_takes(value, shown):
    with pytest.raises(ConfigError) as e:
        load_config(EvaluateConfig, [], ["retriever.name=bm25", f"eval.ks={value}"])
    assert str(e.value) == (f"override 'eval.ks={value}': key 'eval.ks': expects a list such as [1, 3, 5, 7, 10], "
                            f"got {shown}; on the command line: eval.ks=[1,3,5,7,10]")


def test_a_wrong_shape_in_a_file_names_the_file_and_a_scalar_for_a_mapping_says_so(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("retriever: {name: bm25}\neval:\n  ks: five\n")
    with pytest.raises(ConfigError, match=rf"^{bad}: key 'eval.ks': expects a list such as \[1, 3, 5, 7, 10\], "
                                          r"got 'five'$"):
        load_config(EvaluateConfig, [bad], [])
    with pytest.raises(ConfigError, match=r"key 'data.options': expects a mapping \(key: value, \.\.\.\), got 3"):
        load_config(EvaluateConfig, [], ["retriever.name=bm25", "data.options=3"])
