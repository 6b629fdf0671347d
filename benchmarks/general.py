"""Issue "General retriever": one retriever trained on the mixed training splits of the public
datasets (configs/general.yaml), tested zero-shot on datasets it never saw.

    # leave-one-dataset-out: per held-out dataset, a model trained on the others (leaks removed), its
    # zero-shot test R@5 / NDCG@5 beside BM25 and MiniLM (benchmarks/results/baselines.json)
    python benchmarks/general.py lodo [--datasets toollens metatool ...] [--overrides trainer.max_steps=300]
    # the earlier CPU recipe (top 2 layers, 100 steps): the overlay configs/general_top2.yaml
    python benchmarks/general.py lodo --config configs/general_top2.yaml --test-as-train --wise 0.5
    # a recipe variant beside the base rows (own setting; "Recipe variants" table; --label rerun: the base again)
    python benchmarks/general.py lodo --test-as-train --label prefixes --overrides "model.query_prefix='query: '"
    # the all-datasets model (configs/general.yaml as it is): in-domain test rows on ToolLens and MetaTool
    python benchmarks/general.py all --run runs/general [--label "full fine-tune"]
    python benchmarks/general.py render [--page docs/general.md]

Leakage: the mixture adapter drops training queries whose normalised text equals a held-out query and
queries using a tool whose normalised name + description equal a held-out tool's; this script adds
embedding near-duplicates (all-MiniLM-L6-v2 cosine >= --dup-threshold, queries and tools) and records the
counts in each row. Rows go to benchmarks/results/general.json (method ``general_lodo``, setting
``zero-shot``), each with its command, seconds and device.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from results_io import DOCS, RESULTS, ROOT, machine, upsert, write_block  # noqa: E402

NAME = "general"
PAGE = DOCS / "general.md"
TRAIN_SETS = ("toollens", "metatool", "ultratool", "toollinkos", "gorilla-torchhub", "api-bank")
TAT = "zero-shot, test-only datasets train"
ADAPTED = "adapted to the catalog"  # lodo --adapt: appended to the rows' label
LODO_SETS = ("toollens", "metatool", "api-bank", "seal-tools", "nestools", "ultratool", "ultratool-original",
             "toollinkos", "toolbench-g1", "toolbench-g2", "toolbench-g3", "gorilla-huggingface",
             "gorilla-tensorflow", "gorilla-torchhub")
KEEP = ("recall@1", "recall@3", "recall@5", "recall@10", "ndcg@5", "ndcg@10", "mrr")


def baseline(method: str, dataset: str, encoder: str = "all-MiniLM-L6-v2") -> dict:
    """The zero-shot test metrics of BM25 or a dense encoder (``encoder``) from baselines.json."""
    rows = json.loads((RESULTS / "baselines.json").read_text())["rows"]
    found = [r for r in rows if r["method"] == method and r["dataset"] == dataset and r["setting"] == "zero-shot"
             and r["split"] == "test" and (method != "dense" or r.get("encoder") == encoder)]
    return found[0]["metrics"] if found else {}


class NearDuplicates:
    """all-MiniLM-L6-v2 vectors of every text once (one process), and the training items whose cosine
    to a held-out item reaches the threshold."""

    def __init__(self, threshold: float):
        from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

        self.threshold = threshold
        self.model = DenseRetriever(DenseConfig(model="all-MiniLM-L6-v2", max_length=128, batch_size=256))

    def vectors(self, texts: list[str], what: str):
        return self.model.embed(texts, what)

    def find(self, mixture, holdout) -> dict[str, list[str]]:
        import torch

        out: dict[str, list[str]] = {}
        for kind, train_items, held_texts in (
                ("queries", [(q.id, q.text) for q in mixture.queries], [q.text for q in holdout.queries]),
                ("tools", [(t.id, t.document()) for t in mixture.tools], [t.document() for t in holdout.tools])):
            a = self.vectors([t for _, t in train_items], f"near-duplicates: training {kind}")
            b = self.vectors(held_texts, f"near-duplicates: held-out {kind}").to(a.dtype)
            best = torch.cat([(a[s:s + 4096] @ b.T).max(1).values for s in range(0, len(a), 4096)])
            out[kind] = [i for (i, _), s in zip(train_items, best.tolist()) if s >= self.threshold]
        return out


def train_mixture(names: list[str], holdout: str | None, near_dups: Path | None, out: Path,
                  configs: list[str], overrides: list[str], test_as_train: list[str] | None = None) -> dict:
    from toolgraph.config import TrainConfig, load_config
    from toolgraph.training import train

    options = {"datasets": names, "holdout": [holdout] if holdout else [],
               "near_duplicates": str(near_dups) if near_dups else None, "test_as_train": test_as_train or []}
    cfg = load_config(TrainConfig, [ROOT / "configs" / "general.yaml", *configs, {"data": {"options": options}}],
                      [*overrides, f"out_dir={out}"], where="benchmarks/general.py")
    if (out / "results.json").exists():  # finished: read, never retrain
        return json.loads((out / "results.json").read_text())
    train(cfg)
    return json.loads((out / "results.json").read_text())


def adapt(encoder: Path, dataset: str, out: Path, config: str, overrides: list[str]) -> dict:
    """``encoder`` trained on ``dataset``'s catalog alone, its self-supervised pairs (``config``, e.g.
    configs/adapt_catalog.yaml: no query of the dataset is read), into ``out``; a finished folder is read,
    never trained again. The weights are exported as trained: WiSE is applied where they are tested."""
    from toolgraph.config import TrainConfig, load_config
    from toolgraph.training import train

    cfg = load_config(TrainConfig, [config], [f"model.encoder.name={encoder}", f"data.options.dataset={dataset}",
                                              *overrides, "model.wise=null", f"out_dir={out}"], where="--adapt")
    if not (out / "results.json").exists():
        train(cfg)
    return json.loads((out / "results.json").read_text())


def zero_shot(encoder: Path, dataset: str) -> tuple[dict, int]:
    """The exported encoder in place of MiniLM in the dataset's own MiniLM eval file (same protocol): test
    metrics and the number of test queries."""
    return zero_shot_grid(encoder, dataset)[(None, "none", "test")]


def split_rule(spec: str) -> tuple[str, float, bool]:
    """A --query-split rule: ``clauses`` -> (``retriever.query_split`` clauses, ``query_split_whole`` 0,
    ``query_split_cover`` False); ``clauses:0.3`` -> (clauses, 0.3, False): the whole request's score
    weighs 0.3 beside the best piece's; ``clauses:0.3+cover`` -> (clauses, 0.3, True): then each piece's
    own best tool first."""
    from typing import get_args

    from toolgraph.config import QuerySplit

    rule, plus, cover = spec.partition("+")
    name, _, whole = rule.partition(":")
    try:
        weight = float(whole) if whole else 0.0
    except ValueError:
        weight = -1.0
    if (name not in get_args(QuerySplit) or not 0 <= weight <= 1 or (name == "none" and (whole or plus))
            or (plus and cover != "cover")):
        raise argparse.ArgumentTypeError(f"{spec!r}: a query split is one of {', '.join(get_args(QuerySplit))}, "
                                         "a split optionally followed by :W, the whole request's weight in [0, 1], "
                                         "and by +cover, each piece's best tool first")
    return name, weight, bool(plus)


def apply_rule(retriever, spec: str) -> None:
    """Set a dense retriever's ``query_split``, ``query_split_whole`` and ``query_split_cover`` to the rule
    ``spec`` (:func:`split_rule`); its indexed tools stay as they are (a rule only changes how requests score)."""
    from dataclasses import replace

    name, whole, cover = split_rule(spec)
    retriever.config = replace(retriever.config, query_split=name, query_split_whole=whole, query_split_cover=cover)


def second_member(dataset: str, encoder: str):
    """``encoder`` zero-shot on ``dataset``: its MiniLM preset (configs/eval/minilm_<dataset>.yaml) with the
    encoder swapped, as the baseline rows measure it (vectors in the preset's embedding cache)."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.retrieval.loading import resolve_retriever

    cfg = load_config(EvaluateConfig, [ROOT / "configs" / "eval" / f"minilm_{dataset}.yaml"],
                      [f"retriever.encoder.name={encoder}"])
    return resolve_retriever(cfg.retriever)


def with_second(dense, second, weight: float):
    """``dense + weight * second``, each member's scores min-max normalised per query (the hybrid's rule)."""
    from toolgraph.retrieval.pipeline import FusionConfig, FusionRetriever

    return FusionRetriever(FusionConfig(method="score", weights=[1.0, weight], normalize="minmax"),
                           members=[dense, second])


def zero_shot_grid(encoder: Path, dataset: str, alphas: tuple = (None,), rules: tuple = ("none",),
                   splits: tuple = ("test",), base: str = "all-MiniLM-L6-v2",
                   second: tuple[str, float] | None = None) -> dict[tuple, tuple[dict, int]]:
    """{(alpha, rule, split): (metrics, queries)}: :func:`zero_shot` for each WiSE alpha (the weights
    ``alpha * trained + (1 - alpha) * base``, the encoder training started from: WiSE-FT, Wortsman et al.
    2022; None: as trained), each
    ``retriever.query_split`` rule and each split. One retriever per alpha encodes the catalog once for
    every rule and split (a rule changes how requests are scored, never the tools' vectors). ``second``
    (ENCODER, v): the model fused with that encoder zero-shot (:func:`with_second`), which splits each
    request by the same rule."""
    from toolgraph.config import EvaluateConfig, load_config
    from toolgraph.data import prepare_dataset
    from toolgraph.evaluation import evaluate
    from toolgraph.nn.encoder import interpolate_weights
    from toolgraph.retrieval.loading import resolve_retriever

    cfg = load_config(EvaluateConfig, [ROOT / "configs" / "eval" / f"minilm_{dataset}.yaml"],
                      [f"retriever.model={encoder}", "retriever.cache_dir=null"])
    ds, out = prepare_dataset(cfg.data), {}
    other = second_member(dataset, second[0]) if second else None  # indexed once, for every alpha
    for alpha in alphas:
        retriever = resolve_retriever(cfg.retriever)
        if alpha is not None:
            interpolate_weights(retriever.encoder.backbone, base, alpha)
        scorer = with_second(retriever, other, second[1]) if second else retriever
        for rule in rules:
            apply_rule(retriever, rule)
            if other is not None:
                apply_rule(other, rule)
            for split in splits:
                report = evaluate(scorer, ds, split, cfg.eval)
                out[alpha, rule, split] = report.metrics, len(report.query_ids)
    return out


def model_key(query_ids: list[str], label: str | None, configs: list[str], overrides: list[str]) -> str:
    """The run folder name of a leave-one-dataset-out model: its training queries and everything that
    changes its recipe (the text of configs/general.yaml and of every --config file too, so an edited
    config never reuses a folder trained before the edit), so a finished folder is reused only for the
    same model (datasets with no leak share one) and never for another variant's."""
    files = [ROOT / "configs" / "general.yaml", *(Path(c) if Path(c).is_file() else ROOT / c for c in configs)]
    texts = [f.read_text() if f.is_file() else f"missing: {f}" for f in files]
    recipe = [*sorted(query_ids), f"label={label}" if label else "", *configs, *texts, *overrides]
    return hashlib.sha256("\n".join(recipe).encode()).hexdigest()[:12]


def recipe_config(configs: list[str], overrides: list[str]):
    """The recipe's training config: configs/general.yaml, the --config files and --overrides (its
    ``model.encoder.name`` is the encoder WiSE interpolates towards, and the one the rows name)."""
    from toolgraph.config import TrainConfig, load_config

    return load_config(TrainConfig, [ROOT / "configs" / "general.yaml", *configs], overrides,
                       where="benchmarks/general.py")


def extra_training_options(cfg) -> dict:
    """The recipe's ``data.options`` that add training queries (``self_supervised``, ``query_pieces``), so
    that the near-duplicate search sees the pseudo-queries, tool views and request pieces the model will
    train on."""
    options = cfg.data.options or {}
    found = options.get("self_supervised")
    return {"self_supervised": dict(found) if found is not None else None, "query_pieces": options.get("query_pieces")}


def lodo(args: argparse.Namespace) -> None:
    from toolgraph.data.loading import load_dataset
    from toolgraph.nn.encoder import resolve_model

    if args.second:  # a misspelt --second fails here, not after the first fold has trained
        resolve_model(args.second)

    finder = NearDuplicates(args.dup_threshold)
    recipe = recipe_config(args.config, args.overrides)
    extra = extra_training_options(recipe)
    start_from = recipe.model.encoder.name  # MiniLM unless the recipe names another encoder
    runs = Path(args.runs)
    models: dict[str, Path] = {}  # training-set fingerprint -> run folder (datasets with no leak share a model)
    for held in args.datasets:
        start = time.perf_counter()
        as_train = [d for d in LODO_SETS if d not in TRAIN_SETS and d != held] if args.test_as_train else []
        names = [d for d in args.train_sets if d != held] + as_train
        mixture = load_dataset("mixture", datasets=names, holdout=[held], test_as_train=as_train, **extra)
        held_ds = load_dataset(held)
        dups = finder.find(mixture, held_ds)
        dup_file = runs / "near_duplicates" / f"{held}.json"
        dup_file.parent.mkdir(parents=True, exist_ok=True)
        dup_file.write_text(json.dumps(dups))
        kept = load_dataset("mixture", datasets=names, holdout=[held], near_duplicates=str(dup_file),
                            test_as_train=as_train, **extra)
        key = model_key([q.id for q in kept.queries], args.label, args.config, args.overrides)
        run = models.setdefault(key, runs / f"lodo-{key}")
        # the trained weights as they are (model.wise off): --wise interpolates them here, on val and test
        results = train_mixture(names, held, dup_file, run, args.config, ["model.wise=null", *args.overrides], as_train)
        encoder, adapted = run / "retriever" / "encoder", {}
        if args.adapt:  # the fold's model adapted to the held-out catalog's own text (never its queries)
            files = [Path(args.adapt).read_text(), *args.adapt_overrides]
            folder = runs / f"adapt-{held}-{key}-{hashlib.sha256(chr(10).join(files).encode()).hexdigest()[:8]}"
            done = adapt(encoder, held, folder, args.adapt, args.adapt_overrides)
            encoder = folder / "retriever" / "encoder"
            adapted = {"adapt": {"config": args.adapt, "overrides": args.adapt_overrides, "run": str(folder),
                                 "train_seconds": done.get("training", {}).get("train_seconds"),
                                 "steps": done.get("training", {}).get("steps")}}
        minilm, bm25 = baseline("dense", held), baseline("bm25", held)
        has_val = any(q.split == "val" for q in held_ds.queries)  # val chooses alpha (never test)
        second = (args.second, args.second_weight) if args.second else None
        grid = zero_shot_grid(encoder, held, (None, *(a for a in args.wise if a != 1)),
                              tuple(args.query_split), ("test", "val") if has_val else ("test",), start_from, second)
        common = {"method": "general_lodo", "dataset": held, "split": "test", "encoder": start_from,
                  "minilm": {k: minilm.get(k) for k in ("recall@5", "ndcg@5")},
                  "bm25": {k: bm25.get(k) for k in ("recall@5", "ndcg@5")}, "overrides": args.overrides,
                  "trained_on": names, "test_as_train": as_train,
                  "train_queries": sum(r["train"] for r in kept.notes["mixture"].values() if not r.get("self_supervised")),
                  **({"piece_queries": sum(r.get("pieces", 0) for r in kept.notes["mixture"].values())}
                     if extra["query_pieces"] else {}),
                  "self_supervised_queries": sum(r["train"] for r in kept.notes["mixture"].values()
                                                 if r.get("self_supervised")),
                  "leakage_dropped": {name: r["dropped"] for name, r in kept.notes["mixture"].items() if r.get("dropped")},
                  "near_duplicates": {k: len(v) for k, v in dups.items()},
                  "run": str(run), "train_seconds": results.get("training", {}).get("train_seconds"),
                  "steps": results.get("training", {}).get("steps"),
                  "device": results.get("training", {}).get("device"),
                  "seconds": round(time.perf_counter() - start, 1),  # training (or reuse) and every rule's evaluation
                  "command": args.command, "machine": machine(), **adapted,
                  **({"second": {"encoder": args.second, "weight": args.second_weight}} if second else {})}
        named = argparse.Namespace(**{**vars(args), "label": rows_label(args)})
        for qs in args.query_split:  # each rule evaluates the same trained folder
            row = {**common, **rule_fields(named, grid, qs, has_val, bool(as_train))}
            row["delta_r5_vs_minilm"] = round(row["metrics"]["recall@5"] - minilm.get("recall@5", float("nan")), 4)
            upsert(NAME, [row])
            print(f"{held}{f' (query split {qs})' if qs != 'none' else ''}: R@5 {row['metrics']['recall@5']:.4f} "
                  f"(MiniLM {minilm.get('recall@5')}, BM25 {bm25.get('recall@5')}) NDCG@5 "
                  f"{row['metrics']['ndcg@5']:.4f}; dropped {row['leakage_dropped']}; {row['seconds']} s", flush=True)
    render()


def second_part(encoder: str, weight: float) -> str:
    """``+ v x ENCODER``: what a second encoder at weight v adds to a label (general_lodo and query_split rows)."""
    return f"+ {weight:g} x {encoder}"


def rows_label(args: argparse.Namespace) -> str | None:
    """The rows' label: ``--label``, then ``+ v x ENCODER`` with ``--second``, then the adaptation. Only
    ``--label`` is part of the model's folder name: the other two change how the same model is tested."""
    second = second_part(args.second, args.second_weight) if args.second else None
    return ", ".join(x for x in (args.label, second, ADAPTED if args.adapt else None) if x) or None


def rule_fields(args: argparse.Namespace, grid: dict, qs: str, has_val: bool, test_as_train: bool) -> dict:
    """The fields of a general_lodo row that depend on its ``retriever.query_split`` rule ``qs``, from
    :func:`zero_shot_grid`: test metrics as trained, R@5 and NDCG@5 at every --wise alpha, val R@5 as
    trained and at every alpha (where the dataset has a val split); the setting and label name the rule."""
    label = ", ".join(x for x in (args.label, f"query split {qs}" if qs != "none" else None) if x) or None
    metrics, n = grid[None, qs, "test"]

    def at(a: float, split: str) -> dict:
        return grid[None if a == 1 else a, qs, split][0]

    variants = {f"wise-{a}": {k: round(at(a, "test")[k], 4) for k in ("recall@5", "ndcg@5")} for a in args.wise}
    val = {str(a): round(at(a, "val")["recall@5"], 4) for a in [1.0, *args.wise]} if has_val else {}
    setting = (TAT if test_as_train else "zero-shot") + (f", {label}" if label else "")
    return {"setting": setting, "queries": n, "metrics": {k: round(metrics[k], 4) for k in KEEP},
            "variants": variants, "val_recall@5": val, "label": label, "query_split": qs}


def unseen_datasets(rows: list[dict]) -> list[str]:
    """Datasets the all-datasets model never saw: test-only datasets whose main leave-one-dataset-out
    row (trained on the same six training splits) dropped no leak and found no near-duplicate."""
    return [r["dataset"] for r in rows if r["method"] == "general_lodo" and r["setting"] == "zero-shot"
            and r["dataset"] not in TRAIN_SETS and not r["leakage_dropped"] and not any(r["near_duplicates"].values())]


def all_datasets(args: argparse.Namespace) -> None:
    """In-domain test rows on ToolLens and MetaTool; with --unseen, also zero-shot rows on the datasets
    it never saw (unseen_datasets)."""
    run = Path(args.run)
    results = json.loads((run / "results.json").read_text())
    rows = []
    unseen = unseen_datasets(json.loads((RESULTS / f"{NAME}.json").read_text())["rows"]) if args.unseen else []
    for ds in ("toollens", "metatool", *unseen):
        metrics, n = zero_shot(run / "retriever" / "encoder", ds)
        setting = ("zero-shot, never seen" if ds in unseen else "in-domain") + (f", {args.label}" if args.label else "")
        rows.append({"method": "general_all", "dataset": ds, "split": "test", "setting": setting,
                     "encoder": "all-MiniLM-L6-v2", "queries": n,
                     "metrics": {k: round(metrics[k], 4) for k in KEEP}, "run": str(run),
                     "train_seconds": results.get("training", {}).get("train_seconds"),
                     "steps": results.get("training", {}).get("steps"),
                     "device": results.get("training", {}).get("device"), "command": args.command,
                     "machine": machine()})
        print(f"{ds}: R@5 {metrics['recall@5']:.4f} NDCG@5 {metrics['ndcg@5']:.4f}", flush=True)
    upsert(NAME, rows)
    render()


def mcp_rows(args: argparse.Namespace) -> None:
    """Rows of two t2a_mcp.yaml evaluations (toolgraph-general installed, and not: MiniLM)."""
    rows = []
    for run, encoder in ((Path(args.general), "toolgraph-general"), (Path(args.minilm), "all-MiniLM-L6-v2")):
        res = json.loads((run / "results.json").read_text())
        keep = ("recall@5", "ndcg@5", "pass@5")
        own = args.general_label if encoder != "all-MiniLM-L6-v2" else None
        setting = ", ".join(x for x in ("step-wise", encoder, args.label, own) if x)
        rows.append({"method": "t2a", "dataset": args.dataset, "split": "test", "setting": setting,
                     "encoder": encoder, "queries": res["dataset"]["queries"]["test"],
                     "metrics": {k: round(res["metrics"][k], 4) for k in keep},
                     "agent_metrics": {k: round(res["agent_metrics"][k], 4) for k in keep},
                     "command": args.command.replace("{out}", str(run)), "machine": machine()})
    upsert(NAME, rows)
    render()


def install(run: Path) -> None:
    """The run's exported encoder installed as toolgraph-general (``toolgraph models install general``)."""
    from toolgraph.models import install_model

    install_model("general", run)


def chosen_alpha(rows: list[dict]) -> tuple[str, dict[str, float]]:
    """The WiSE alpha with the best mean R@5 on the held-out datasets' val splits (never test), by the
    rule of ``toolgraph.tuning.pick`` (a tie: the smallest alpha), and that mean for every alpha tried."""
    from toolgraph.tuning import pick

    alphas = sorted({a for r in rows for a in r.get("val_recall@5", {})}, key=float)
    means = {a: sum(r["val_recall@5"][a] for r in rows if a in r.get("val_recall@5", {}))
             / max(1, sum(a in r.get("val_recall@5", {}) for r in rows)) for a in alphas}
    return (alphas[pick([{"recall@5": means[a]} for a in alphas], "recall@5")] if means else "1.0"), means


def at_alpha(row: dict, alpha: str) -> dict:
    """A row's test R@5 / NDCG@5 with the weights at ``alpha`` (1.0 = as trained)."""
    return row["metrics"] if float(alpha) == 1 else row["variants"][f"wise-{float(alpha)}"]


def mean_r5(rows: list[dict], alpha: str) -> tuple[float, float]:
    """Mean test R@5 of ``rows`` at WiSE ``alpha``, and MiniLM's mean on the same datasets."""
    return (sum(at_alpha(r, alpha)["recall@5"] for r in rows) / len(rows),
            sum(r["minilm"]["recall@5"] for r in rows) / len(rows))


def short_device(device: str | None) -> str:
    """"cpu: 1 process(es) x 2 threads, 2 cores available" -> "CPU, 2 threads"; GPU names as they are."""
    if not device:
        return "–"
    if device.startswith("cpu:"):
        return "CPU, " + device.split(" x ")[-1].split(",")[0]
    return device


RERUN = "rerun"  # lodo --label rerun: the base recipe again (e.g. on another device), not a variant


def variants_table(labelled: list[dict], rows: list[dict]) -> str:
    """Each labelled run (``lodo --label``) beside the base recipe's row of the same held-out dataset
    and setting, on the same device where there is one (the unlabelled row, else a ``rerun``), else the
    unlabelled row: val R@5 (what decides) at alpha 1.0 and 0.5, and test R@5 as trained; means per
    label over the datasets both have. A ``rerun`` is compared with the unlabelled row (device noise), a
    ``--query-split`` row with the same models' row without the split."""
    bases: dict[tuple[str, str], list[dict]] = {}
    unsplit: dict[tuple[str, str], list[dict]] = {}  # every row evaluated without a query split
    for r in rows:
        if r["method"] == "general_lodo" and r.get("query_split", "none") == "none":
            unsplit.setdefault((r["dataset"], r["setting"]), []).append(r)
            if r.get("label") in (None, RERUN):
                bases.setdefault((r["dataset"], r["setting"].removesuffix(f", {RERUN}")), []).append(r)

    every = {(r["dataset"], r["setting"]): r for r in rows if r["method"] == "general_lodo"}

    def base_for(r: dict, setting: str) -> dict | None:
        if r.get("adapt"):  # the same models before they were adapted to the catalog
            return every.get((r["dataset"], r["setting"].replace(f", {ADAPTED}", "")))
        if r.get("second"):  # the same models, the same rule, without the second encoder
            return every.get((r["dataset"], r["setting"].replace(f", {second_part(**r['second'])}", "")))
        if r.get("query_split", "none") != "none":
            return (unsplit.get((r["dataset"], r["setting"].removesuffix(f", query split {r['query_split']}"))) or [None])[0]
        found = [b for b in bases.get((r["dataset"], setting), []) if b is not r]
        main = [b for b in found if not b.get("label")]
        same = [b for b in found if b.get("device") == r.get("device")] if r["label"] != RERUN else []
        return (same or main or [None])[0]

    lines = ["| variant | held-out dataset | val R@5, alpha 1.0 (base → variant) | val R@5, alpha 0.5 | "
             "test R@5 as trained | base row | device |", "|---|---|---|---|---|---|---|"]
    for label in dict.fromkeys(r["label"] for r in labelled):
        sums: dict[str, list[float]] = {}
        mine = sorted((r for r in labelled if r["label"] == label), key=lambda r: LODO_SETS.index(r["dataset"]))
        for r in mine:
            b = base_for(r, r["setting"].removesuffix(f", {label}"))
            cells = []
            for key, new, old in (("val 1.0", r["val_recall@5"].get("1.0"), b and b["val_recall@5"].get("1.0")),
                                  ("val 0.5", r["val_recall@5"].get("0.5"), b and b["val_recall@5"].get("0.5")),
                                  ("test", r["metrics"]["recall@5"], b and b["metrics"]["recall@5"])):
                if new is None or old is None:
                    cells.append("–" if new is None else f"– → {new:.4f}")
                    continue
                cells.append(f"{old:.4f} → {new:.4f}")
                sums.setdefault(key, []).append(new - old)
            without = (f" without {r['second']['encoder']}" if r.get("second") else " without the split"
                       if r.get("query_split", "none") != "none" and not r.get("adapt") else "")
            where = "–" if b is None else (b.get("label") or "main") + without + (
                ", same device" if b.get("device") == r.get("device") else f", {short_device(b.get('device'))}")
            lines.append(f"| {label} | {r['dataset']} | {' | '.join(cells)} | {where} | {short_device(r.get('device'))} |")
        mean = [f"{sum(v) / len(v):+.4f} ({len(v)})" if (v := sums.get(k)) else "–" for k in ("val 1.0", "val 0.5", "test")]
        lines.append(f"| **{label}: mean change** (datasets) | | {' | '.join(mean)} | | |")
    return "\n".join(lines)


def recipes_table(rows: list[dict]) -> str:
    """One line per recipe (a leave-one-dataset-out setting; reruns left out): its held-out datasets,
    mean val R@5 per alpha, the alpha val chooses, and at that alpha the mean test R@5, MiniLM's mean on
    the same datasets, the mean difference and the worst dataset's. The goal: mean >= +0.10, worst >= -0.01."""
    lodo = [r for r in rows if r["method"] == "general_lodo" and r.get("label") != RERUN]
    lines = ["| recipe (setting) | held-out datasets | mean val R@5 by alpha | alpha | mean test R@5 | MiniLM "
             "| Δ mean | worst Δ | device |", "|---|---|---|---|---|---|---|---|---|"]
    for setting in dict.fromkeys(r["setting"] for r in lodo):
        mine = [r for r in lodo if r["setting"] == setting]
        alpha, means = chosen_alpha(mine)
        deltas = {r["dataset"]: at_alpha(r, alpha)["recall@5"] - r["minilm"]["recall@5"] for r in mine}
        worst = min(deltas, key=deltas.get)
        test, base = mean_r5(mine, alpha)
        devices = ", ".join(sorted({short_device(r.get("device")) for r in mine}))
        lines.append(f"| {setting} | {len(mine)} | " + ", ".join(f"{a}: {m:.4f}" for a, m in means.items())
                     + f" | {alpha} | {test:.3f} | {base:.3f} | {test - base:+.3f} | {deltas[worst]:+.3f} ({worst}) "
                     f"| {devices} |")
    return "\n".join(lines)


def recipe_rows_table(mine: list[dict]) -> str:
    """Per held-out dataset, one recipe's test R@5 / NDCG@5 at the alpha its val splits choose, beside
    MiniLM and BM25."""
    alpha, means = chosen_alpha(mine)
    lines = [f"WiSE alpha chosen on the held-out datasets' val splits: **{alpha}** (mean val R@5 "
             + ", ".join(f"alpha {a}: {m:.4f}" for a, m in means.items()) + ").", "",
             f"| held-out dataset | R@5 (alpha {alpha}) | NDCG@5 | R@5 as trained | MiniLM R@5 | BM25 R@5 "
             "| Δ R@5 vs MiniLM | training queries | steps | train seconds | device |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    mine = sorted(mine, key=lambda r: LODO_SETS.index(r["dataset"]) if r["dataset"] in LODO_SETS else 99)
    for r in mine:
        m = at_alpha(r, alpha)
        lines.append(f"| {r['dataset']} | {m['recall@5']:.3f} | {m['ndcg@5']:.3f} | {r['metrics']['recall@5']:.3f} "
                     f"| {r['minilm']['recall@5']:.3f} | {r['bm25']['recall@5']:.3f} "
                     f"| {m['recall@5'] - r['minilm']['recall@5']:+.3f} | {r['train_queries']} | {r.get('steps')} "
                     f"| {r.get('train_seconds')} | {r.get('device') or '–'} |")
    mean, base = mean_r5(mine, alpha)
    lines.append(f"| **mean of {len(mine)}** | **{mean:.3f}** | | | {base:.3f} | | **{mean - base:+.3f}** | | | | |")
    return "\n".join(lines)


def per_dataset_fast() -> dict[str, str]:
    """Test R@5 of the fast per-dataset bi-encoder (``bi_encoder_fast`` rows of training_core.json,
    2 CPU cores, transductive) by dataset: what a model trained on that dataset alone reaches."""
    path = RESULTS / "training_core.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    return {r["dataset"]: f"{r['metrics']['recall@5']:.3f}" for r in rows
            if r["method"] == "bi_encoder_fast" and r["setting"] == "transductive" and r["split"] == "test"}


MPNET = "all-mpnet-base-v2"


def encoders_table(rows: list[dict]) -> str:
    """Zero-shot test R@5 per leave-one-dataset-out dataset: BM25, MiniLM, all-mpnet-base-v2 (rows of
    baselines.json) and the t2a default rule with MiniLM (min-max dense + 0.3 BM25, ``hybrid_minilm`` rows
    of general_hybrid.py), and their means over the datasets where all four are measured."""
    hybrid = {r["dataset"]: r["metrics"]["0.3"]["recall@5"] for r in rows
              if r["method"] == "hybrid_minilm" and r["setting"] == "zero-shot" and "0.3" in r["metrics"]}
    lines = ["| dataset | BM25 R@5 | MiniLM R@5 | all-mpnet-base-v2 R@5 | Δ mpnet vs MiniLM | MiniLM + 0.3 BM25 R@5 |",
             "|---|---|---|---|---|---|"]
    cols: list[tuple[float, ...]] = []
    for d in LODO_SETS:
        bm25, minilm = baseline("bm25", d).get("recall@5"), baseline("dense", d).get("recall@5")
        mpnet, fused = baseline("dense", d, MPNET).get("recall@5"), hybrid.get(d)
        cell = [f"{v:.3f}" if v is not None else "–" for v in (bm25, minilm, mpnet)]
        delta = f"{mpnet - minilm:+.3f}" if mpnet is not None and minilm is not None else "–"
        lines.append(f"| {d} | {' | '.join(cell)} | {delta} | {f'{fused:.3f}' if fused is not None else '–'} |")
        if None not in (bm25, minilm, mpnet, fused):
            cols.append((bm25, minilm, mpnet, fused))
    if cols:
        b, m, p, f = (sum(c[i] for c in cols) / len(cols) for i in range(4))
        lines.append(f"| **mean of {len(cols)}** | {b:.3f} | {m:.3f} | {p:.3f} | {p - m:+.3f} | {f:.3f} |")
    return "\n".join(lines)


FULL_FT = f"{TAT}, full fine-tune"  # the recipe of the GPU runs (docs/general.md, "Full fine-tuning")


def render(page: str | Path = PAGE) -> None:
    path = RESULTS / f"{NAME}.json"
    if not path.exists() or not Path(page).exists():
        return
    rows = json.loads(path.read_text())["rows"]
    lodo_rows = sorted([r for r in rows if r["method"] == "general_lodo" and r["setting"] == "zero-shot"],
                       key=lambda r: LODO_SETS.index(r["dataset"]) if r["dataset"] in LODO_SETS else 99)
    alpha, means = chosen_alpha(lodo_rows)
    lines = [f"WiSE alpha chosen on the held-out datasets' val splits: **{alpha}** (mean val R@5 "
             + ", ".join(f"alpha {a}: {m:.4f}" for a, m in means.items()) + ").", "",
             "| held-out dataset | R@5 | NDCG@5 | R@5 as trained | MiniLM R@5 | BM25 R@5 | Δ R@5 vs MiniLM "
             "| training queries | dropped as leaks | steps | device |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    deltas = []
    for r in lodo_rows:
        m = at_alpha(r, alpha)
        dropped = sum(n for d in r["leakage_dropped"].values() for n in d.values())
        deltas.append(m["recall@5"] - r["minilm"]["recall@5"])
        lines.append(f"| {r['dataset']} | {m['recall@5']:.3f} | {m['ndcg@5']:.3f} | {r['metrics']['recall@5']:.3f} "
                     f"| {r['minilm']['recall@5']:.3f} | {r['bm25']['recall@5']:.3f} | {deltas[-1]:+.3f} "
                     f"| {r['train_queries']} | {dropped} | {r.get('steps')} | {r.get('device') or '–'} |")
    if lodo_rows:
        mean, base = mean_r5(lodo_rows, alpha)
        lines.append(f"| **mean of {len(lodo_rows)}** | **{mean:.3f}** | | | {base:.3f} | | **{mean - base:+.3f}** "
                     f"| | | | |")
    write_block(page, "general-lodo", "\n".join(lines))
    main = {r["dataset"]: r for r in lodo_rows}
    tat = [r for r in rows if r["method"] == "general_lodo" and r["setting"] == TAT]
    if tat:
        t_alpha, t_means = chosen_alpha(tat)  # these models' own alpha, chosen on val like the main table's
        table = [f"WiSE alpha chosen on the held-out datasets' val splits: **{t_alpha}** (mean val R@5 "
                 + ", ".join(f"alpha {a}: {m:.4f}" for a, m in t_means.items()) + ").", "",
                 f"| held-out dataset | R@5 (alpha {t_alpha}) | R@5 as trained | training queries | main table R@5 "
                 f"(alpha {alpha}, as trained) | MiniLM R@5 | Δ R@5 vs MiniLM | steps | device |",
                 "|---|---|---|---|---|---|---|---|---|"]
        tat = sorted(tat, key=lambda r: LODO_SETS.index(r["dataset"]))
        for r in tat:
            m, old = at_alpha(r, t_alpha), main.get(r["dataset"])
            before = f"{at_alpha(old, alpha)['recall@5']:.3f}, {old['metrics']['recall@5']:.3f}" if old else "–"
            table.append(f"| {r['dataset']} | {m['recall@5']:.3f} | {r['metrics']['recall@5']:.3f} | {r['train_queries']} "
                         f"| {before} | {r['minilm']['recall@5']:.3f} | {m['recall@5'] - r['minilm']['recall@5']:+.3f} "
                         f"| {r.get('steps')} | {r.get('device') or '–'} |")
        mean, base = mean_r5(tat, t_alpha)
        table.append(f"| **mean of {len(tat)}** | **{mean:.3f}** | | | | {base:.3f} | **{mean - base:+.3f}** | | |")
        write_block(page, "general-test-as-train", "\n".join(table))
    labelled = [r for r in rows if r["method"] == "general_lodo" and r.get("label")]
    if labelled:
        write_block(page, "general-variants", variants_table(labelled, rows))
    full = [r for r in rows if r["method"] == "general_lodo" and r["setting"] == FULL_FT]
    if full:
        write_block(page, "general-full-finetune", recipe_rows_table(full))
    if any(r["method"] == "general_lodo" for r in rows):
        write_block(page, "general-recipes", recipes_table(rows))
    if (RESULTS / "baselines.json").exists():  # the zero-shot rows of benchmarks/baselines.py
        write_block(page, "general-encoders", encoders_table(rows))
    domain = [r for r in rows if r["method"] == "general_all"]
    if domain:
        fast = per_dataset_fast()
        table = ["| dataset | setting | R@5 | NDCG@5 | per-dataset fast model R@5 | MiniLM R@5 | steps | train seconds "
                 "| device |", "|---|---|---|---|---|---|---|---|---|"]
        table += [f"| {r['dataset']} | {r['setting']} | {r['metrics']['recall@5']:.3f} | {r['metrics']['ndcg@5']:.3f} "
                  f"| {fast.get(r['dataset'], '–')} | {baseline('dense', r['dataset']).get('recall@5', float('nan')):.3f} "
                  f"| {r.get('steps')} "
                  f"| {r.get('train_seconds')} | {r.get('device') or '–'} |" for r in domain]
        write_block(page, "general-all", "\n".join(table))
    mcp = [r for r in rows if r["method"] == "t2a"]
    if mcp:
        table = ["| catalog | setting | agent R@5 | agent NDCG@5 | tool R@5 | tool NDCG@5 |", "|---|---|---|---|---|---|"]
        table += [f"| {r['dataset']} | {r['setting']} | {r['agent_metrics']['recall@5']:.3f} "
                  f"| {r['agent_metrics']['ndcg@5']:.3f} | {r['metrics']['recall@5']:.3f} | {r['metrics']['ndcg@5']:.3f} |"
                  for r in mcp]
        write_block(page, "general-mcp", "\n".join(table))


def main() -> None:
    from typing import get_args

    from toolgraph.config import QuerySplit

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("lodo", help="leave-one-dataset-out rows")
    a.add_argument("--datasets", nargs="+", default=list(LODO_SETS), choices=LODO_SETS)
    a.add_argument("--runs", default="runs/general_lodo")
    a.add_argument("--wise", nargs="*", type=float, default=[],
                   help="also test these weight interpolations with MiniLM (WiSE-FT alpha; 1 = as trained)")
    a.add_argument("--train-sets", nargs="+", default=list(TRAIN_SETS), choices=TRAIN_SETS,
                   help="the datasets with training splits mixed (each model: these minus the held-out one)")
    a.add_argument("--test-as-train", action="store_true",
                   help="the datasets published with a test split only (all but the held-out one) train too")
    a.add_argument("--config", nargs="*", default=[], help="config files over configs/general.yaml (e.g. a cluster overlay)")
    a.add_argument("--overrides", nargs="*", default=[], help="train.py overrides for every model (key=value)")
    a.add_argument("--query-split", nargs="+", default=["none"], type=lambda spec: split_rule(spec) and spec,
                   help=f"evaluate with each of these retriever.query_split rules ({', '.join(get_args(QuerySplit))}; "
                        "clauses:0.3: the whole request weighs 0.3 beside the best piece, query_split_whole; "
                        "clauses:0.3+cover: then each piece's best tool first, query_split_cover), a row "
                        "each; not part of the model: each rule evaluates the same trained folder")
    a.add_argument("--label", default=None,
                   help="a recipe variant or a rerun (e.g. 'prefixes'): appended to the rows' setting, so they sit "
                        "beside the main rows instead of replacing them (docs/general.md, 'Recipe variants')")
    a.add_argument("--adapt", default=None, metavar="CONFIG",
                   help="adapt each model to the held-out catalog before testing it: CONFIG (configs/adapt_catalog.yaml) "
                        "trains it on the catalog's own self-supervised pairs, never a query; the rows' label gets "
                        "', adapted to the catalog'. The models themselves are the ones --label names (reused)")
    a.add_argument("--adapt-overrides", nargs="*", default=[], help="train.py overrides for the adaptation (key=value)")
    a.add_argument("--second", default=None, metavar="ENCODER",
                   help="test each model fused with this encoder zero-shot (e.g. all-mpnet-base-v2: min-max scores, "
                        "model + v x ENCODER, the encoder splitting requests by the same rule); the rows' label gets "
                        "'+ v x ENCODER'. The models are the ones --label names (reused)")
    a.add_argument("--second-weight", type=float, default=None, metavar="V",
                   help="--second: its weight v beside the model's 1.0 (default 0.25, chosen on val by "
                        "benchmarks/query_split.py --second)")
    a.add_argument("--dup-threshold", type=float, default=0.95, help="cosine of an embedding near-duplicate")
    a.add_argument("--command", default=None, help="recorded in the rows (default: this command line)")
    b = sub.add_parser("all", help="in-domain rows of the all-datasets model")
    b.add_argument("--run", default="runs/general")
    b.add_argument("--label", default=None, help="another recipe or device (e.g. 'full fine-tune'): rows beside the "
                                                 "main in-domain rows instead of replacing them")
    b.add_argument("--unseen", action="store_true",
                   help="also zero-shot rows on the test-only datasets it never saw (no leak, no near-duplicate)")
    b.add_argument("--command", default=None)
    m = sub.add_parser("mcp", help="rows of configs/eval/t2a_mcp.yaml run with and without the general model")
    m.add_argument("--general", required=True, help="evaluate.py --out folder, toolgraph-general installed")
    m.add_argument("--minilm", required=True, help="the same with TOOLGRAPH_MODELS pointing nowhere (MiniLM)")
    m.add_argument("--dataset", default="draft-g2@mcp-layout/category")
    m.add_argument("--command", required=True, help="the evaluate.py command; {out} stands for the folder")
    m.add_argument("--label", default=None, help="appended to both rows' setting (e.g. which scorer)")
    m.add_argument("--general-label", default=None, help="appended to the general model's row (which model)")
    i = sub.add_parser("install", help="copy a run's exported encoder to where the name toolgraph-general finds it")
    i.add_argument("--run", default="runs/general")
    r = sub.add_parser("render")
    r.add_argument("--page", default=str(PAGE))
    args = p.parse_args()
    if args.cmd == "lodo":
        if args.second_weight is not None and not args.second:
            a.error("--second-weight: give --second ENCODER too")
        if args.second_weight is not None and args.second_weight <= 0:
            a.error(f"--second-weight: {args.second_weight:g} is not above 0 (leave --second out for the model alone)")
        args.second_weight = 0.25 if args.second_weight is None else args.second_weight
    if getattr(args, "command", "x") is None:
        args.command = "python " + " ".join(shlex.quote(x) for x in sys.argv)
    commands = {"lodo": lodo, "all": all_datasets, "mcp": mcp_rows, "install": lambda a: install(Path(a.run)),
                "render": lambda a: render(a.page)}
    commands[args.cmd](args)


if __name__ == "__main__":
    main()
