"""data.name: mixture — several datasets' training splits as one catalog, without leaks from held-out
datasets; batches from one dataset each; full-catalog negatives from the batch's own dataset."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_overrides

from toolgraph.config import TrainConfig, load_config
from toolgraph.data.loading import load_dataset
from toolgraph.data.sources.mixture import normalize_text, source_of
from toolgraph.data.text import ContrastiveBatchSampler
from toolgraph.errors import ConfigError, DataError


def _write(folder: Path, tools: list[dict], queries: list[dict]) -> Path:
    folder.mkdir(parents=True)
    for name, rows in [("tools", tools), ("queries", queries)]:
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(autouse=True)
def _data_root(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLGRAPH_DATA", str(tmp_path))  # the mixed folders are paths; the root is unused


@pytest.fixture
def three(tmp_path):
    """A and B mixed; C held out: C shares A's weather tool (other id, other punctuation) and one of B's
    query texts (other case)."""
    a = _write(tmp_path / "a", [{"id": "w", "name": "get_weather", "description": "Current weather for a city."},
                                {"id": "m", "name": "send_mail", "description": "Send an e-mail."}],
               [{"id": "1", "text": "weather in Paris?", "tools": ["w"], "split": "train"},
                {"id": "2", "text": "mail Bob", "tools": ["m"], "split": "train"},
                {"id": "3", "text": "mail Ann and check the weather", "tools": ["m", "w"], "split": "train"},
                {"id": "4", "text": "mail Eve", "tools": ["m"], "split": "val"},
                {"id": "5", "text": "mail Joe", "tools": ["m"], "split": "val"},
                {"id": "6", "text": "mail Max", "tools": ["m"], "split": "test"}])
    b = _write(tmp_path / "b", [{"id": "w", "name": "stock_price", "description": "A share's price."}],
               [{"id": "1", "text": "Price of ACME shares", "tools": ["w"], "split": "train"},
                {"id": "2", "text": "price of Initech", "tools": ["w"], "split": "train"}])
    c = _write(tmp_path / "c", [{"id": "x9", "name": "Get-Weather", "description": "current weather, for a city"}],
               [{"id": "1", "text": "PRICE OF ACME SHARES!", "tools": ["x9"], "split": "test"}])
    return str(a), str(b), str(c)


def test_ids_are_prefixed_test_splits_left_out_and_val_capped(three):
    a, b, _ = three
    ds = load_dataset("mixture", datasets=[a, b], max_val_per_dataset=1)
    assert {t.id for t in ds.tools} == {f"{a}::w", f"{a}::m", f"{b}::w"}  # same id "w" in A and B: two tools
    assert Counter(q.split for q in ds.queries) == {"train": 5, "val": 1}
    assert {source_of(q.id) for q in ds.queries} == {a, b}
    assert all(source_of(t) == source_of(q.id) for q in ds.queries for t in q.tools)
    assert ds.notes["mixture"][a] == {"tools": 2, "tools_also_held_out": 0, "train": 3, "val": 1, "dropped": {}}


def test_held_out_queries_and_tools_never_reach_training(three, tmp_path):
    a, b, c = three
    ds = load_dataset("mixture", datasets=[a, b], holdout=c)
    kept = {q.id for q in ds.queries}
    assert kept == {f"{a}::2", f"{a}::4", f"{a}::5", f"{b}::2"}  # A's weather queries and B's ACME query gone
    assert ds.skipped == {f"{a}: query using a tool also in a held-out dataset": 2,
                          f"{b}: query text also in a held-out dataset": 1}
    assert ds.notes["mixture"][a]["tools_also_held_out"] == 1 and ds.notes["holdout"] == [c]
    # embedding near-duplicates found elsewhere (benchmarks/general.py) come as a file of ids
    dups = tmp_path / "dups.json"
    dups.write_text(json.dumps({"queries": [f"{a}::4"], "tools": [f"{b}::w"]}))
    ds = load_dataset("mixture", datasets=[a, b], holdout=c, near_duplicates=str(dups))
    assert {q.id for q in ds.queries} == {f"{a}::2", f"{a}::5"}
    assert ds.skipped[f"{a}: query near-duplicate of a held-out query (embedding)"] == 1
    assert ds.skipped[f"{b}: query using a tool also in a held-out dataset"] == 1
    assert normalize_text("Get-Weather: current weather, for a city") == "get weather current weather for a city"


def test_test_as_train_turns_a_test_only_dataset_into_training_data(three):
    a, b, c = three
    ds = load_dataset("mixture", datasets=[a, c], test_as_train=[c])
    assert {q.id: q.split for q in ds.queries if source_of(q.id) == c} == {f"{c}::1": "train"}
    assert not any(q.split == "test" for q in ds.queries)  # A's test query stays out
    assert ds.notes["mixture"][c]["train"] == 1 and ds.notes["test_as_train"] == [c]
    # a held-out dataset's leaks are still dropped from the relabelled queries
    ds = load_dataset("mixture", datasets=[a, c], test_as_train=c, holdout=b)
    assert ds.skipped == {f"{c}: query text also in a held-out dataset": 1}


@pytest.mark.parametrize("options,err,needle", [
    ({}, ConfigError, "data.options.datasets"),
    ({"datasets": [7]}, ConfigError, "neither a name"),
    ({"datasets": ["A", "A"]}, ConfigError, "named twice"),
    ({"datasets": ["A"], "holdout": ["A"]}, ConfigError, "also mixed into training"),
    ({"datasets": ["A"], "near_duplicates": "BAD"}, DataError, "bad.json"),
    ({"datasets": ["A"], "near_duplicates": "BAD2"}, DataError, "bad2.json.*lists of id strings"),
    ({"datasets": ["A"], "holdout": ["A2"]}, DataError, "no training query left"),
    ({"datasets": ["A"], "test_as_train": ["A2"]}, ConfigError, "test_as_train.*not in data.options.datasets"),
])
def test_bad_mixture_options_name_the_key_or_file(three, tmp_path, options, err, needle):
    a = three[0]
    (tmp_path / "bad.json").write_text('{"queries": [], "other": 1}')
    (tmp_path / "bad2.json").write_text('{"queries": [1, 2]}')
    a2 = shutil.copytree(a, tmp_path / "a2")
    fill = {"A": a, "A2": str(a2), "BAD": str(tmp_path / "bad.json"), "BAD2": str(tmp_path / "bad2.json")}
    options = {k: ([fill.get(x, x) for x in v] if isinstance(v, list) else fill.get(v, v)) for k, v in options.items()}
    with pytest.raises(err, match=needle):
        load_dataset("mixture", **options)


def test_grouped_batches_come_from_one_dataset_in_tempered_shares():
    sizes = {0: 800, 1: 200, 2: 50}
    groups = [g for g, n in sizes.items() for _ in range(n)]
    gold = [[i % 40 + 40 * g] for i, g in enumerate(groups)]  # 40 tools per group
    for temperature in (1.0, 2.0):
        sampler = ContrastiveBatchSampler(gold, 10, seed=3, groups=groups, temperature=temperature)
        plan = sampler.plan()
        per_batch = [{groups[q] for q, _, _ in b} for b in plan]
        assert all(len(s) == 1 for s in per_batch)  # every batch from one dataset
        share = Counter(next(iter(s)) for s in per_batch)
        total = len(groups) // 10
        weight = {g: n ** (1 / temperature) for g, n in sizes.items()}
        for g in sizes:  # n_g^(1/T) of the epoch's batches, small groups repeated to fill their share
            assert share[g] == round(total * weight[g] / sum(weight.values()))
        small = {q for b in plan for q, _, _ in b if groups[q] == 2}
        assert small == {q for q, g in enumerate(groups) if g == 2}  # the small dataset is seen whole
    assert ContrastiveBatchSampler(gold, 10, seed=3, groups=groups, temperature=2.0).plan() == plan  # deterministic
    with pytest.raises(ValueError, match="groups"):
        ContrastiveBatchSampler(gold, 10, groups=groups[:-1])


def test_a_dataset_smaller_than_a_batch_fills_its_batches_by_repeating_its_queries():
    """ToolBench G3's 61 test queries in the general recipe's batch of 128 once got no batch at all."""
    groups = [0] * 300 + [1] * 7
    gold = [[i % 60] if g == 0 else [100 + i % 3] for i, g in enumerate(groups)]  # the small one: 3 tools
    plan = ContrastiveBatchSampler(gold, 16, seed=5, groups=groups).plan()
    small = [b for b in plan if groups[b[0][0]] == 1]
    assert len(small) == max(1, round(len(groups) // 16 * 7 / 307)) == 1
    assert all(len(b) == 16 for b in plan)  # full batches only (the cross-rank gather needs equal sizes)
    assert {q for q, _, _ in small[0]} == set(range(300, 307))  # every one of its queries, some twice
    assert ContrastiveBatchSampler(gold, 16, seed=5, groups=groups).plan() == plan  # deterministic
    assert ContrastiveBatchSampler(gold[300:], 16, seed=5).plan() == []  # no groups: training refuses it by name


@pytest.fixture
def two_copies(synthetic_dataset_dir, tmp_path):
    b = shutil.copytree(synthetic_dataset_dir, tmp_path / "copy")
    return [str(synthetic_dataset_dir), str(b)]


def _mixture_overrides(two_copies, tiny_bert_dir, out, steps=12):
    over = [o for o in tiny_train_overrides(Path(two_copies[0]), tiny_bert_dir, out, steps=steps)
            if not o.startswith("data.name=")]
    return over + ["data.name=mixture", f"data.options.datasets=[{two_copies[0]},{two_copies[1]}]",
                   "data.test_split=val", "test=false", "model.loss=full_catalog", "model.multi_positive=true",
                   "model.refresh_every=4"]


def test_full_catalog_negatives_come_from_the_batch_dataset_only(two_copies, tiny_bert_dir, tmp_path):
    from toolgraph.registry import TASKS

    cfg = load_config(TrainConfig, [], _mixture_overrides(two_copies, tiny_bert_dir, tmp_path / "run"))
    task = TASKS.get("bi_encoder")(cfg)
    dm = task.datamodule_for()
    assert task.contrastive.groups.tolist() == [0] * 24 + [1] * 24
    task.eval()
    batch = next(iter(dm.train_dataloader()))
    group = task.contrastive.groups[batch["gold"][0, 0]].item()
    assert set(task.contrastive.groups[batch["gold"][batch["gold"] >= 0]].tolist()) == {group}
    loss = task.compute_loss(batch)
    with torch.no_grad():
        lure = task.query_encoder(**batch["query"]).mean(0) * 50  # scores far above every gold tool
    other = task.contrastive.groups != group
    task.contrastive.bank[other] = lure  # would dominate every softmax if the other dataset's tools were negatives
    assert torch.allclose(task.compute_loss(batch), loss)
    gold = set(batch["gold"][batch["gold"] >= 0].tolist())
    own_negative = next(i for i in range(48) if not other[i] and i not in gold)
    task.contrastive.bank[own_negative] = lure
    assert task.compute_loss(batch) > loss + 1  # a negative of its own catalog does count


def test_a_mixture_trains_exports_wise_weights_and_reports_on_val(two_copies, tiny_bert_dir, tmp_path):
    from transformers import AutoModel

    from toolgraph.training import train

    over = _mixture_overrides(two_copies, tiny_bert_dir, tmp_path / "run") + ["model.wise=0.5"]
    summary = train(load_config(TrainConfig, [], over))
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert res["config"]["data"]["test_split"] == "val" and res["dataset"]["queries"]["test"] == 0
    assert summary["global_step"] == 12 and res["metrics"]["recall@5"] > 0
    trained = torch.load(summary["best_checkpoint"], map_location="cpu", weights_only=True)["state_dict"]
    name = "encoder.layer.1.output.dense.weight"
    base = AutoModel.from_pretrained(tiny_bert_dir).state_dict()[name]
    exported = AutoModel.from_pretrained(tmp_path / "run" / "retriever" / "encoder").state_dict()[name]
    assert torch.allclose(exported, 0.5 * trained[f"query_encoder.backbone.{name}"] + 0.5 * base, atol=1e-6)
    assert not torch.allclose(exported, base)


def test_wise_towards_another_encoder_is_refused_naming_it(tiny_bert_dir, tmp_path):
    """WiSE interpolates towards the encoder training started from; a model of another shape (MiniLM's
    weights for an mpnet-trained model) is a ConfigError naming it, never a shape error mid-evaluation."""
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

    from toolgraph.nn.encoder import interpolate_weights

    wider = tmp_path / "wider"
    cfg = BertConfig.from_pretrained(tiny_bert_dir)
    cfg.hidden_size, cfg.intermediate_size = 64, 128
    BertModel(cfg, add_pooling_layer=False).save_pretrained(wider)
    AutoTokenizer.from_pretrained(tiny_bert_dir).save_pretrained(wider)
    model = AutoModel.from_pretrained(tiny_bert_dir, add_pooling_layer=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError, match="wider.*is not the encoder these weights were trained from"):
        interpolate_weights(model, str(wider), 0.5)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    interpolate_weights(model, str(tiny_bert_dir), 0.5)  # its own start: the weights stay (0.5 x w + 0.5 x w)
    assert all(torch.allclose(before[k].float(), v.float()) for k, v in model.state_dict().items())


def test_the_general_model_by_name_is_the_installed_one_else_minilm(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    from toolgraph.nn import encoder

    monkeypatch.setattr(encoder, "_SAID", set())
    monkeypatch.setenv("TOOLGRAPH_MODELS", str(tmp_path / "models"))
    assert encoder.resolve_model("toolgraph-general") == encoder.resolve_model("all-MiniLM-L6-v2")
    assert "toolgraph-general is not installed" in capsys.readouterr().err
    shutil.copytree(tiny_bert_dir, tmp_path / "models" / "toolgraph-general")
    assert encoder.resolve_model("toolgraph-general") == str(tmp_path / "models" / "toolgraph-general")
    assert "the general tool retriever at" in capsys.readouterr().err
    from toolgraph.retrieval.agents import DEFAULT_DENSE
    from toolgraph.retrieval.dense import DenseConfig
    from toolgraph.retrieval.loading import resolve_retriever

    dense = resolve_retriever(DenseConfig(**{k: v for k, v in DEFAULT_DENSE.items() if k != "name"}, cache_dir=None))
    assert dense.encoder.dim == 32  # the t2a default (MCP server, index sync) loads the installed model


@pytest.mark.realdata
def test_the_shipped_mixture_is_every_split_of_the_14_datasets_and_drops_what_toolbench_shares(data_root):
    import yaml

    options = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/general.yaml").read_text())["data"]["options"]
    assert options["test_as_train"] == options["datasets"] and len(options["datasets"]) == 14  # every split
    ds = load_dataset("mixture", root=data_root, **options)
    assert ds.stats()["queries"] == {"train": 47408, "val": 2021, "test": 0} and len(ds.tools) == 13370
    assert not ds.skipped
    # held out as leave-one-dataset-out does: ToolBench G1's tools are also in ToolLens, G2 and G3
    rest = [d for d in options["datasets"] if d != "toolbench-g1"]
    ds = load_dataset("mixture", root=data_root, datasets=rest, test_as_train=rest, holdout=["toolbench-g1"])
    assert ds.stats()["queries"] == {"train": 43668, "val": 2021, "test": 0} and len(ds.tools) == 11686
    assert ds.skipped == {"toollens: query using a tool also in a held-out dataset": 3448,
                          "toolbench-g2: query using a tool also in a held-out dataset": 98,
                          "toolbench-g3: query using a tool also in a held-out dataset": 34}


def test_self_supervised_components_take_the_query_text_out_of_the_tool(three, tmp_path):
    a, b, c = three
    q = _write(tmp_path / "q", [{"id": "z", "name": "zip_files", "description": "Pack files into one zip. Keeps folders.",
                                 "parameters": {"properties": {"paths": {"description": "files to pack"},
                                                               "level": {"description": "1 to 9"}}}}], [])
    ssl = {"kinds": ["ict", "name", "params"], "catalogs": [str(q)], "share": 0.25, "max_tools": 5}
    ds = load_dataset("mixture", datasets=[a, b], holdout=c, self_supervised=ssl)
    parts = {n: r for n, r in ds.notes["mixture"].items() if r.get("self_supervised")}
    # A's weather tool is held out (C has it): no pair from it; A's and B's other descriptions are under
    # four words (no inverse cloze); the queryless catalog gives all three kinds
    assert sorted(parts) == [f"ssl-ict@{q}", f"ssl-name@{a}", f"ssl-name@{b}", f"ssl-name@{q}", f"ssl-params@{q}"]
    assert parts[f"ssl-name@{a}"]["train"] == 1
    tools = {t.id: t for t in ds.tools}
    pseudo = {q_.id.split("::", 1)[0]: q_ for q_ in ds.queries if q_.id.startswith("ssl-")}
    assert all(q_.split == "train" and len(q_.tools) == 1 for q_ in pseudo.values())
    ict = pseudo[f"ssl-ict@{q}"]
    view = tools[ict.tools[0]]
    assert ict.text in ("Pack files into one zip.", "Keeps folders.") and ict.text not in view.document()
    assert pseudo[f"ssl-name@{q}"].text == "zip files" and "zip_files" not in tools[pseudo[f"ssl-name@{q}"].tools[0]].document()
    params = pseudo[f"ssl-params@{q}"]
    assert params.text == "paths: files to pack; level: 1 to 9" and "paths" not in tools[params.tools[0]].document()
    assert not any(t.startswith("ssl-") and t.endswith(f"{a}::w") for t in tools)  # none from the held-out tool
    assert not any(f"{q}::" in x.id for x in ds.queries if not x.id.startswith("ssl-"))  # queryless: pairs only
    from toolgraph.data.sources.mixture import pinned_groups, source_groups

    inside, share = pinned_groups(ds)
    names = sorted(ds.notes["mixture"])
    assert share == 0.25 and {names[i] for i in inside} == set(parts)
    assert source_groups(ds, [view.id]) == [names.index(f"ssl-ict@{q}")]


@pytest.mark.parametrize("spec,needle", [
    ("ict", "expected a mapping"),
    ({"kinds": ["cloze"]}, r"kinds: \['cloze'\] not among"),
    ({"share": 1.5}, "share: 1.5 is not a fraction"),
    ({"weight": 1}, "self_supervised.weight: unknown key"),
    ({"max_tools": "ten"}, "max_tools: 'ten' has the wrong type"),
    ({"catalogs": ["A"]}, "already mixed or held out"),
])
def test_bad_self_supervised_options_name_the_key(three, spec, needle):
    with pytest.raises(ConfigError, match=needle):
        load_dataset("mixture", datasets=[three[0]], self_supervised=spec if spec != {"catalogs": ["A"]}
                     else {"catalogs": [three[0]]})


def test_pinned_groups_get_their_share_of_the_batches():
    sizes = {0: 800, 1: 200, 2: 300, 3: 100}  # 2 and 3: self-supervised, pinned to 20 %
    groups = [g for g, n in sizes.items() for _ in range(n)]
    gold = [[i % 40 + 40 * g] for i, g in enumerate(groups)]
    plan = ContrastiveBatchSampler(gold, 10, seed=1, groups=groups, temperature=2.0,
                                   pinned=(frozenset({2, 3}), 0.2)).plan()
    share = Counter(groups[b[0][0]] for b in plan)
    assert abs((share[2] + share[3]) / len(plan) - 0.2) < 0.02
    assert share[2] / share[3] == pytest.approx(3 ** 0.5, rel=0.1)  # within the pinned groups: n^(1/T) as before
    assert share[0] / share[1] == pytest.approx(2.0, rel=0.1)


def test_a_mixed_tool_reads_as_it_does_in_its_own_dataset(tmp_path):
    a = _write(tmp_path / "own", [{"id": "w", "name": "get_weather", "description": "Weather for a city.",
                                   "agent": "Weather Co"}],
               [{"id": "1", "text": "weather in Oslo", "tools": ["w"], "split": "train"}])
    (a / "agents.jsonl").write_text(json.dumps({"id": "Weather Co", "name": "Weather Co"}) + "\n")
    own = load_dataset(str(a)).tools[0]
    mixed = load_dataset("mixture", datasets=[str(a)]).tools[0]
    assert mixed.agent == f"{a}::Weather Co"  # ids keep the dataset prefix (agents of two datasets never merge)
    assert mixed.document() == own.document() == "get_weather: Weather for a city. from Weather Co"


def test_max_queries_per_tool_spreads_a_dataset_over_its_tools():
    """ToolLinkOS-like: one tool answers most requests. With a cap of 3 a pass keeps at most 3 queries per tool,
    so the popular tool's share of the positives falls from ~80 % to a few per cent; the dataset shares stay."""
    groups = [0] * 500 + [1] * 500
    gold = [[0] if i < 400 else [1 + i % 50] for i in range(500)] + [[100 + i % 50] for i in range(500)]
    plain = ContrastiveBatchSampler(gold, 10, seed=2, groups=groups).plan()
    capped = ContrastiveBatchSampler(gold, 10, seed=2, groups=groups, max_per_tool=3).plan()
    assert len(capped) == len(plain) == 100
    share = Counter(groups[b[0][0]] for b in capped)
    assert share == Counter(groups[b[0][0]] for b in plain) == {0: 50, 1: 50}  # dataset shares unchanged
    popular = [sum(t == 0 for _, t, _ in b) / len(b) for b in plain + capped if groups[b[0][0]] == 0]
    assert sum(popular[:50]) / 50 > 0.5  # uncapped: the one tool is the positive of most group-0 queries
    assert sum(popular[50:]) / 50 < 0.1  # capped: at most 3 of each ~150-query pass
    assert {t for b in capped for _, t, _ in b if groups[b[0][0]] == 0} == set(range(51))  # every tool seen
    assert ContrastiveBatchSampler(gold, 10, seed=2, groups=groups, max_per_tool=3).plan() == capped


def test_max_queries_per_tool_without_groups_is_one_capped_pass():
    gold = [[0]] * 300 + [[1 + i % 20] for i in range(100)]  # 300 queries of tool 0, 5 of each other tool
    plan = ContrastiveBatchSampler(gold, 10, seed=0, max_per_tool=4).plan()
    used = Counter(t for b in plan for _, t, _ in b)
    assert max(used.values()) <= 4 and len(plan) == 8  # 21 tools x 4 = 84 queries: 8 full batches
    assert ContrastiveBatchSampler(gold, 10, seed=0).plan() == ContrastiveBatchSampler(gold, 10, seed=0,
                                                                                       max_per_tool=None).plan()


def test_max_queries_per_tool_caps_the_positives_of_multi_tool_queries_exactly():
    """Each kept query's drawn tool is its positive: with queries of two or three gold tools (tool 0 in every
    one) no tool is the positive of more than the cap in a pass (a query never falls back to another of its
    tools), and every positive is a gold tool of its query."""
    import random

    rng = random.Random(0)
    gold = [[0] + rng.sample(range(1, 30), rng.choice([1, 2])) for _ in range(600)]
    sampler = ContrastiveBatchSampler(gold, 8, seed=3, max_per_tool=5)
    plan = sampler.plan()  # no groups: one capped pass
    used = Counter(t for b in plan for _, t, _ in b)
    assert max(used.values()) == 5 and sampler.kept == 30 * 5 and len(plan) == 150 // 8
    assert all(t in gold[q] for b in plan for q, t, _ in b)
    kept, positive = sampler.capped(list(range(600)), random.Random(1))  # a mixture group's pass: the same calls
    packed = sampler.pack(sampler.filled(kept), random.Random(1), positive)
    assert all(t == positive[q] for b in packed for q, t in b)
    assert max(Counter(t for b in packed for _, t in b).values()) <= 5
    assert sampler.capped(list(range(600)), random.Random(1)) == (kept, positive)  # seeded


def test_max_queries_per_tool_is_checked_and_reaches_the_sampler(two_copies, tiny_bert_dir, tmp_path):
    from toolgraph.config import TextDataConfig
    from toolgraph.registry import TASKS

    with pytest.raises(ConfigError, match="data.max_queries_per_tool"):
        load_config(TrainConfig, [], ["data.max_queries_per_tool=0"])
    assert TextDataConfig().max_queries_per_tool is None
    over = _mixture_overrides(two_copies, tiny_bert_dir, tmp_path / "run") + ["data.max_queries_per_tool=2"]
    dm = TASKS.get("bi_encoder")(load_config(TrainConfig, [], over)).datamodule_for()
    assert dm.train_sampler(0, 1).max_per_tool == 2
