"""The ``toolgraph`` command: data, evaluate, tune, train, retrieve, report, serve, mcp-config, index sync.

Imports little at its top (the standard library and ``toolgraph.errors``): each command imports what it
needs, so ``toolgraph serve`` starts answering MCP clients without waiting for torch."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from toolgraph.errors import ConfigError, ToolgraphError


def _offline_defaults() -> None:
    # never reach for the Hugging Face hub implicitly: a missing model must fail fast and clearly
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _options(items: Sequence[str]) -> dict:
    from toolgraph.config import parse_options

    return parse_options(items, "adapter option")


def cmd_data(args: argparse.Namespace) -> int:
    from toolgraph.data import load_dataset
    from toolgraph.data.formats import write_dataset
    from toolgraph.registry import DATASETS

    if args.action == "tdi":
        return cmd_tdi(args)
    if args.action == "list":
        for name in DATASETS.names():
            doc = (DATASETS.get(name).__doc__ or "").strip().splitlines()
            print(f"{name:24s} {doc[0] if doc else ''}")
        return 0
    if not args.name:
        raise ToolgraphError(f"toolgraph data {args.action} needs a dataset NAME (see: toolgraph data list)")
    ds = load_dataset(args.name, args.root, **_options(args.options))
    if args.action == "stats":
        stats = ds.stats()
        if args.json:
            print(json.dumps(stats, indent=2))
        else:
            for key, value in stats.items():
                print(f"{key:22s} {value}")
        return 0
    if not args.dir:
        raise ToolgraphError("toolgraph data export NAME DIR: DIR missing")
    folder = write_dataset(ds, args.dir)
    print(f"wrote {folder} ({len(ds.tools)} tools, {len(ds.queries)} queries)")
    return 0


def cmd_tdi(args: argparse.Namespace) -> int:
    """toolgraph data tdi build OUT [key=value ...]: the dependency pair sets, with counts."""
    from toolgraph.config import load_config
    from toolgraph.data.tdi import TDIConfig, build_tdi, write_tdi

    if args.name != "build" or not args.dir:
        raise ToolgraphError("usage: toolgraph data tdi build OUT [key=value ...] (TDIConfig keys, e.g. seed=1)")
    cfg = load_config(TDIConfig, [], args.options)
    tdi = build_tdi(cfg, args.root)
    folder = write_tdi(tdi, args.dir)
    counts = tdi.counts()
    for name in tdi.pairs:
        c = counts[name]
        per_class = ", ".join(f"{k} {v}" for k, v in c["per_class"].items())
        print(f"{name:9s} {c['total']:6d} pairs ({per_class}; {c['tools']} tools)")
        for source, by in c["per_source"].items():
            print(f"    {source:12s} " + ", ".join(f"{k} {v}" for k, v in by.items()))
    for reason, n in counts["dropped"].items():
        print(f"dropped   {n:6d} {reason}")
    print(f"wrote {folder}")
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    """toolgraph graph build --discriminator CKPT|RUN --data NAME --out DIR [key=value ...]."""
    from toolgraph.config import load_config
    from toolgraph.data import load_dataset
    from toolgraph.depgraph import GraphConfig, build_graph, write_graph
    from toolgraph.retrieval.loading import load_task
    from toolgraph.runs import resolve_checkpoint

    cfg = load_config(GraphConfig, [], args.overrides)
    ds = load_dataset(args.data, args.root, **_options(args.option))
    task = load_task(resolve_checkpoint(args.discriminator, "--discriminator"))
    edges, stats = build_graph(ds, task, cfg)
    if stats["rank"] != 0:  # under DDP every rank holds the gathered scores; one writes
        return 0
    folder = write_graph(edges, stats, args.out, str(args.discriminator))
    print(f"{stats['tools']} tools, {stats['pairs_scored']} pairs scored = "
          f"{100 * stats['fraction_of_n_squared']:.3f}% of N^2 ({stats['n_squared']}); "
          f"gold pairs among candidates {stats['gold_pairs_in_candidates']:.3f}; gold edges recovered at "
          f"p>={stats['edge_threshold']} {stats['gold_edges_recovered']:.3f} ({stats['gold_edges']} gold); "
          f"{stats['edges_kept']} edges kept, precision {stats['edge_precision']:.3f}; "
          f"{stats['seconds_candidates']}s candidates + {stats['seconds_scoring']}s scoring")
    print(f"wrote {folder}/edges.jsonl, stats.json")
    return 0


def _evaluate_config(args: argparse.Namespace):  # noqa: ANN202 - an EvaluateConfig
    """The evaluation config of ``evaluate`` and ``tune``: ``--config`` files (default: the data a
    ``--checkpoint`` was trained on) then overrides, ``--checkpoint`` and ``--out`` over them; the output
    folder checked before any work (never write into someone else's folder). With ``--print-config``:
    printed, and None (the command stops there, exit 0)."""
    from toolgraph.config import EvaluateConfig, load_config, to_yaml
    from toolgraph.runs import check_output_folder

    sources = list(args.config)
    if args.checkpoint and not sources:
        from toolgraph.evaluation import trained_on  # (imports torch: only when it is needed)

        sources = [trained_on(args.checkpoint)]  # evaluate where it was trained (its splits), unless told
    cfg = load_config(EvaluateConfig, sources, args.overrides)
    if args.checkpoint:
        cfg.checkpoint = args.checkpoint
    if args.out:
        cfg.out = args.out
    if args.print_config:  # printed, and nothing else is done (no folder is checked or written)
        print(to_yaml(cfg))
        return None
    if cfg.out:
        check_output_folder(cfg.out, "--out" if args.out else "out")
    return cfg


def cmd_evaluate(args: argparse.Namespace) -> int:
    cfg = _evaluate_config(args)
    if cfg is None:  # --print-config
        return 0
    from toolgraph.evaluation import format_table, run  # (imports torch)

    report = run(cfg)
    print(format_table({report.label: report.metrics}, cfg.eval.ks))
    if report.agent_metrics:
        print(format_table({"agents: " + report.label: report.agent_metrics}, cfg.eval.ks))
    print("timings: " + ", ".join(f"{k}={v:.2f}" for k, v in report.timings.items()))
    if cfg.out:
        print(f"wrote {cfg.out}/results.json, rankings.jsonl, curves.png, config.yaml"
              f"{'' if cfg.checkpoint else ', retriever/'}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Settings chosen on val (a grid of overrides, toolgraph/tuning.py), then the winner tested once."""
    from toolgraph.tuning import choose_on_val, parse_grid

    grid = parse_grid(args.grid)  # a bad --grid fails before the config's work
    cfg = _evaluate_config(args)
    if cfg is None:  # --print-config
        return 0
    from toolgraph.evaluation import format_table
    tuned = choose_on_val(cfg, grid, args.metric, val_split=args.val_split, log=print)
    report = tuned.report
    label = (f"{tuned.retriever.name} on {cfg.data.name}/{cfg.data.split} ({len(report.query_ids)} queries), "
             + " ".join(f"{k}={v}" for k, v in tuned.winner.items()) + f" (chosen on {args.val_split})")
    print(format_table({label: report.metrics}, cfg.eval.ks))
    print(f"val grid: {len(tuned.table)} points in {tuned.seconds:.1f} s; ties: the point listed first")
    if cfg.out:
        print(f"wrote {cfg.out}/results.json (with the val table under 'tuning'), rankings.jsonl, curves.png, "
              "config.yaml, retriever/ (the tuned retriever)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from toolgraph.config import load_config, to_yaml
    from toolgraph.evaluation import format_table
    from toolgraph.training import TrainConfig, train

    cfg = load_config(TrainConfig, args.config, args.overrides)
    if args.out:
        cfg.out_dir = args.out
    if args.print_config:  # printed, and nothing is trained
        print(to_yaml(cfg))
        return 0
    summary = train(cfg)
    metrics = summary.get("metrics") or {}
    if any("@" in k for k in metrics):  # a retriever: the usual table
        print(format_table({f"{cfg.model.name} ({cfg.out_dir})": metrics}, cfg.eval.ks))
        print(f"wrote {cfg.out_dir}/results.json, retriever/, checkpoints/")
    elif metrics:  # a classifier (the dependency discriminator): its test report
        print("\n".join(f"{k:28s} {v:.4f}" for k, v in sorted(metrics.items())))
        print(f"wrote {cfg.out_dir}/results.json, checkpoints/")
    return 0


def cmd_retrieve(args: argparse.Namespace) -> int:
    from toolgraph.retrieval.loading import load

    retriever = load(args.checkpoint)
    if args.graph:
        from toolgraph.retrieval.tgr import with_graph

        retriever = with_graph(retriever, args.graph, **_options(args.graph_option))
    from toolgraph.retrieval.dense import embedding_cache_off

    with embedding_cache_off():  # a read: the queries (user text) are never written to ./.cache, as in serve
        ranking = retriever.retrieve(args.queries, args.k)
    by_id = {t.id: t for t in retriever.tools}
    for query, ids, scores in zip(args.queries, ranking.ids, ranking.scores.tolist(), strict=True):
        print(f"# {query}")
        for rank, (tid, score) in enumerate(zip(ids, scores, strict=True), 1):
            t = by_id[tid]
            owner = f" [{t.agent}]" if t.agent else ""
            print(f"{rank:3d}. {score:8.4f}  {tid}  {t.name}{owner}: {t.description[:80]}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from toolgraph.serving import serve

    serve(args.retriever, args.transport, args.host, args.port, args.max_batch, args.max_query_chars,
          args.max_body_bytes, args.request_timeout, args.allowed_host, args.allowed_origin,
          limit_concurrency=args.limit_concurrency, header_timeout=args.header_timeout,
          keep_alive_timeout=args.keep_alive_timeout)
    return 0


MCP_CLIENTS = ("claude-desktop", "cursor", "vscode", "claude-code", "inspector", "generic")
SERVER_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # a server never reaches for the hub
WHERE = {  # what to do with the printed config (said on stderr: stdout is the config alone)
    "claude-desktop": "add it to claude_desktop_config.json (macOS: ~/Library/Application Support/Claude/, Windows: "
                      "%APPDATA%\\Claude\\; merge it into an existing mcpServers), then restart Claude Desktop",
    "cursor": "put it in ~/.cursor/mcp.json (every project) or .cursor/mcp.json (one project; merge into an "
              "existing mcpServers)",
    "vscode": "put it in .vscode/mcp.json of the workspace (merge into an existing servers)",
    "claude-code": "run it (add --scope user for every project)",
    "inspector": "run it: it lists the tools (--method tools/call --tool-name search_tools --tool-arg query=... "
                 "--tool-arg k=3 calls one)",
    "generic": "a client that starts stdio servers runs command + args with env; over HTTP it connects to url",
}


def toolgraph_command() -> list[str]:
    """The absolute command that runs this environment's ``toolgraph``: the console script beside the
    Python running now (the path is made absolute, not resolved: a venv's python is a symlink, and the
    script must be the venv's), else that Python with ``-m toolgraph.cli``. A client starts servers
    with its own PATH, where a bare ``toolgraph`` is not found (``spawn toolgraph ENOENT``)."""
    python = Path(os.path.abspath(sys.executable))
    for name in ("toolgraph", "toolgraph.exe"):
        exe = python.parent / name
        if exe.is_file() and os.access(exe, os.X_OK):
            return [str(exe)]
    return [str(python), "-m", "toolgraph.cli"]


def mcp_client_config(client: str, command: list[str], index: str, transport: str = "stdio", port: int = 8000,
                      name: str = "toolgraph") -> str:
    """The text ``toolgraph mcp-config`` prints: ``client``'s configuration of the toolgraph server over
    ``index`` (absolute paths), in that client's own format."""
    if client not in MCP_CLIENTS:
        raise ToolgraphError(f"--client must be one of {', '.join(MCP_CLIENTS)}, got {client!r}")
    argv = [*command[1:], "serve", "--retriever", index]
    url = f"http://127.0.0.1:{port}/mcp"
    if transport == "stdio":
        spec: dict = {"command": command[0], "args": argv, "env": dict(SERVER_ENV)}
    elif client == "claude-desktop":
        raise ToolgraphError("--client claude-desktop --transport http: Claude Desktop's config file starts stdio "
                             "servers only; use --transport stdio (a remote server is added under Settings > "
                             "Connectors instead)")
    else:
        spec = {"url": url}
    if client in ("claude-desktop", "cursor"):
        return json.dumps({"mcpServers": {name: spec}}, indent=2)
    if client == "vscode":
        return json.dumps({"servers": {name: {"type": transport, **spec}}}, indent=2)
    if client == "generic":
        return json.dumps({"name": name, "transport": transport, **spec}, indent=2)
    if client == "claude-code":  # the name before --env: the variadic --env would take it as a value
        if transport == "http":
            return shlex.join(["claude", "mcp", "add", "--transport", "http", name, url])
        env = [word for key, value in SERVER_ENV.items() for word in ("--env", f"{key}={value}")]
        return shlex.join(["claude", "mcp", "add", "--transport", "stdio", name, *env, "--", command[0], *argv])
    inspector = ["npx", "-y", "@modelcontextprotocol/inspector", "--cli"]
    if transport == "http":
        return shlex.join([*inspector, url, "--transport", "http", "--method", "tools/list"])
    env = [word for key, value in SERVER_ENV.items() for word in ("-e", f"{key}={value}")]
    return shlex.join([*inspector, *env, command[0], *argv, "--method", "tools/list"])


def cmd_mcp_config(args: argparse.Namespace) -> int:
    """toolgraph mcp-config --retriever DIR [--client C] [--transport stdio|http] [--port N]: a client's config."""
    from toolgraph.serving import check_servable

    check_servable(args.retriever)  # the checks serve makes before it starts (exit 2 naming the file)
    index = os.path.abspath(args.retriever)  # absolute, links kept (a synced index may be a symlink)
    command = toolgraph_command()
    print(mcp_client_config(args.client, command, index, args.transport, args.port, args.name))
    if len(command) > 1:
        print(f"note: no toolgraph executable beside {command[0]}; the config runs {shlex.join(command)} (install "
              "the package: pip install -e .)", file=sys.stderr)
    if args.transport == "http":
        start = [*command, "serve", "--retriever", index, "--transport", "http", "--port", str(args.port)]
        print(f"start the server first: {shlex.join(start)}", file=sys.stderr)
    print(f"{args.client}: {WHERE[args.client]}", file=sys.stderr)
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    if args.action == "feedback":
        return cmd_index_feedback(args)
    if args.action == "train":
        return cmd_index_train(args)
    from toolgraph.sync import sync_index

    if args.catalog is None:
        raise ConfigError("index sync: give the CATALOG (MCP servers JSON, a tools/list folder or a dataset folder)")

    spec = None
    if args.retriever_config:
        from omegaconf import OmegaConf

        from toolgraph.config import no_interpolation, yaml_sources

        # the file over the presets its defaults: list names, as --config reads it
        spec = OmegaConf.to_container(OmegaConf.merge(*(node for _, node in yaml_sources(args.retriever_config))))
        spec = spec.get("retriever", spec)
        # the spec is saved in the index's retriever.json: a ${oc.env:...} would be resolved into it
        no_interpolation(spec, f"--retriever-config {args.retriever_config}", "retriever")
    limit = {} if args.max_text_chars is None else {"max_text_chars": args.max_text_chars}  # None: the reader's
    counts = sync_index(args.catalog, args.index, spec, wait=args.wait, on_duplicate=args.on_duplicate, **limit)
    print(json.dumps(counts))  # "skipped": the repeats --on-duplicate left out, by reason
    if counts["skipped"]:
        print(f"skipped {sum(counts['skipped'].values())} catalog entries: "
              + ", ".join(f"{n} {why}" for why, n in counts["skipped"].items()), file=sys.stderr)
    return 0


def cmd_index_feedback(args: argparse.Namespace) -> int:
    from toolgraph.feedback import apply_feedback

    if args.remove and not (args.query or args.before is not None):
        raise ConfigError("index feedback --remove: say what to remove: --query TEXT (repeatable) or --before TIME")
    if not args.remove and (args.query or args.before is not None):
        raise ConfigError("index feedback: --query and --before select entries to delete; add --remove")
    if args.remove and args.catalog is not None:
        raise ConfigError("index feedback --remove takes no LOG.jsonl: add a log and remove entries in two runs")
    counts = apply_feedback(args.catalog, args.index, wait=args.wait, cap=args.cap, remove_queries=args.query or (),
                            before=args.before)
    print(json.dumps(counts))
    return 0


def cmd_index_train(args: argparse.Namespace) -> int:
    from toolgraph.feedback import train_index

    if args.catalog is not None:
        raise ConfigError(f"index train takes no positional argument (got {args.catalog!r}): it trains on the "
                          "index's own log; add logs with toolgraph index feedback LOG.jsonl --index DIR")
    print(json.dumps(train_index(args.index, args.out, args.config, args.overrides, args.min_queries, args.wait)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """A checkpoint (e.g. one kept mid-run) -> the retriever folder train.py would have exported."""
    from toolgraph.cards import write_cards
    from toolgraph.retrieval.loading import load_task
    from toolgraph.runs import check_output_folder

    # a new or empty folder, or an earlier export (replaced whole, atomically); anything else is refused
    check_output_folder(args.out, "--out", ("retriever.json", "manifest.json"))
    task = load_task(args.checkpoint)
    if args.graph:  # the same encoder and tools, smoothed over a dependency graph: what `serve` then loads
        import tempfile

        from toolgraph.retrieval.loading import load
        from toolgraph.retrieval.tgr import with_graph

        out = Path(args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.plain-") as plain:
            task.export_retriever(plain)  # a bad graph fails here, before --out is touched
            retriever = with_graph(load(plain), args.graph, **_options(args.graph_option))
            retriever.save(args.out)
    else:
        retriever = task.export_retriever(args.out)
    write_cards(args.out, {"config": task.hparams["config"]}, name=Path(args.out).resolve().name)  # no test metrics
    print(f"wrote {args.out}: {retriever.name} retriever over {len(retriever.tools)} tools")
    return 0


def cmd_encoder(args: argparse.Namespace) -> int:
    from toolgraph.retrieval.static import build_static

    folder = build_static(args.out, args.source, a=args.sif, drop=args.drop)
    print(f"wrote {folder}: a static encoder distilled from {args.source} (retriever.encoder: {folder})")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """Versions, devices, data, models and caches, with the fix for what is missing; exit 1 if a
    recipe would miss something."""
    from dataclasses import asdict

    from toolgraph.doctor import diagnose, format_checks

    checks = diagnose()
    print(json.dumps([asdict(c) for c in checks], indent=1) if args.json else format_checks(checks))
    return 1 if any(c.status == "missing" for c in checks) else 0


def cmd_models(args: argparse.Namespace) -> int:
    """toolgraph models build NAME [key=value ...] | models install NAME --run RUN (toolgraph/models.py)."""
    from toolgraph.models import build_model, install_model

    if args.action == "build":
        build_model(args.name, args.config, args.overrides)
    else:
        if args.overrides:
            raise ConfigError(f"models install: no key=value overrides (got {args.overrides[0]!r}); give --run RUN")
        install_model(args.name, args.run)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from toolgraph.evaluation import format_table
    from toolgraph.runs import read_results

    rows, ks = {}, [1, 3, 5, 7, 10]
    for folder in args.dirs:
        path = Path(folder) / "results.json"
        if not path.is_file():
            raise ToolgraphError(f"{path}: not found (run toolgraph evaluate --out {folder} first, or re-run it "
                                 "if it was interrupted)")
        res = read_results(path)
        config = res.get("config") if isinstance(res.get("config"), dict) else {}
        ks = (config.get("eval") or {}).get("ks", ks)
        kind = (config.get("retriever") or config.get("model") or {}).get("name", "?")
        rows[f"{kind} ({Path(folder).name})"] = res.get("metrics", {})
    print(format_table(rows, ks))
    if args.ci:
        from toolgraph.report import format_significance, load_run, significance

        runs = [load_run(f) for f in args.dirs]
        print()
        print(format_significance(significance(runs, args.metric, args.samples), args.metric, args.samples))
    if args.html:
        from toolgraph.report import write_html

        print(f"wrote {write_html(args.dirs, args.html, k=args.k)}")
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="toolgraph", description="Train, evaluate and serve tool retrievers.")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("data", help="inspect and export datasets")
    d.add_argument("action", choices=["list", "stats", "export", "tdi"])
    d.add_argument("name", nargs="?", help="registry name or canonical JSONL folder")
    d.add_argument("dir", nargs="?", help="output folder (export)")
    d.add_argument("options", nargs="*", help="adapter options key=value (e.g. val_fraction=0.2)")
    d.add_argument("--json", action="store_true", help="stats as JSON")
    d.add_argument("--root", default=None, help="data folder (default: $TOOLGRAPH_DATA)")
    d.set_defaults(fn=cmd_data)

    g = sub.add_parser("graph", aliases=["depgraph"], help="build a tool-dependency graph with a trained discriminator")
    g.add_argument("action", choices=["build"])
    g.add_argument("--discriminator", required=True, help="discriminator .ckpt or its run folder")
    g.add_argument("--data", required=True, help="dataset name or canonical JSONL folder")
    g.add_argument("--option", action="append", default=[], help="adapter option key=value (repeatable)")
    g.add_argument("--out", required=True, help="output folder (edges.jsonl, stats.json)")
    g.add_argument("--root", default=None, help="data folder (default: $TOOLGRAPH_DATA)")
    g.add_argument("overrides", nargs="*", help="GraphConfig key=value (top_m=10 threshold=0.5 devices=2 ...)")
    g.set_defaults(fn=cmd_graph)

    e = sub.add_parser("evaluate", help="evaluate a retriever on a dataset split")
    add_evaluate_args(e)
    e.set_defaults(fn=cmd_evaluate)

    tu = sub.add_parser("tune", help="choose settings on val (a grid of overrides), then test the winner once")
    add_evaluate_args(tu)
    tu.add_argument("--grid", action="append", required=True, metavar="KEY=V1,V2,...",
                    help="a config key and its candidate values (YAML; repeatable: the grid is their product, "
                         "first key outermost), e.g. retriever.first_stage_weight=0,0.5,1,2")
    tu.add_argument("--metric", default="recall@5",
                    help="the metric val chooses by; a comma list breaks ties in order (recall@5,recall@3); "
                         "a tie on all of them goes to the grid point listed first")
    tu.add_argument("--val-split", default="val", help="the split the grid is scored on (the test split: data.split)")
    tu.set_defaults(fn=cmd_tune)

    t = sub.add_parser("train", help="train a task (then test the best checkpoint and export a retriever)")
    add_evaluate_args(t)
    t.set_defaults(fn=cmd_train)

    q = sub.add_parser("retrieve", help="top tools for queries, from a checkpoint or saved retriever")
    q.add_argument("--checkpoint", required=True, help=".ckpt, exported retriever folder, or run folder")
    q.add_argument("-k", type=int, default=5)
    q.add_argument("--graph", default=None, help="a dependency graph (toolgraph depgraph build folder or edges.jsonl): "
                   "TGR over the retriever's encoder")
    q.add_argument("--graph-option", action="append", default=[], help="TGR key=value: alpha, boost, threshold, ...")
    q.add_argument("queries", nargs="+")
    q.set_defaults(fn=cmd_retrieve)

    x = sub.add_parser("export", help="export the retriever of a .ckpt to a folder (toolgraph.load reads it)")
    x.add_argument("--checkpoint", required=True, help="a toolgraph .ckpt")
    x.add_argument("--out", required=True, help="output folder")
    x.add_argument("--graph", default=None, help="a dependency graph folder or edges.jsonl: export a TGR retriever")
    x.add_argument("--graph-option", action="append", default=[], help="TGR key=value: alpha, boost, threshold, ...")
    x.set_defaults(fn=cmd_export)

    v = sub.add_parser("serve", help="serve a saved retriever as an MCP server (search_tools, search_agents)")
    v.add_argument("--retriever", required=True, help="saved retriever / index folder, run folder or .ckpt")
    v.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                   help="stdio, or http: MCP streamable HTTP at /mcp plus JSON routes /search, /search_agents")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--max-batch", type=int, default=32, help="concurrent requests answered in one batch (1: off)")
    v.add_argument("--max-query-chars", type=int, default=4096, help="longer queries are refused (HTTP 413 / MCP error)")
    v.add_argument("--max-body-bytes", type=int, default=65536, help="larger request bodies are refused (HTTP 413)")
    v.add_argument("--request-timeout", type=float, default=30.0, help="seconds before a request gets 503 / an MCP error")
    v.add_argument("--limit-concurrency", type=int, default=100, help="HTTP connections open at once; one more gets 503")
    v.add_argument("--header-timeout", type=float, default=10.0, help="seconds to send a whole request, else 408")
    v.add_argument("--keep-alive-timeout", type=float, default=5.0,
                   help="seconds an idle keep-alive connection stays open")
    v.add_argument("--allowed-host", action="append", default=None,
                   help="accepted Host header, name:* = any port (repeatable; default 127.0.0.1:*, localhost:*, "
                        "[::1]:*; '*': no Host/Origin check)")
    v.add_argument("--allowed-origin", action="append", default=None,
                   help="accepted Origin header (repeatable; default http://127.0.0.1:*, http://localhost:*, "
                        "http://[::1]:*)")
    v.set_defaults(fn=cmd_serve)

    mc = sub.add_parser("mcp-config", help="print an MCP client's config for serving an index (absolute paths)")
    mc.add_argument("--retriever", required=True, help="the index folder (as for serve): saved retriever, run folder or .ckpt")
    mc.add_argument("--client", choices=MCP_CLIENTS, default="claude-desktop",
                    help="the client's format: claude-desktop / cursor ({\"mcpServers\": ...}), vscode (.vscode/mcp.json), "
                         "claude-code (a claude mcp add line), inspector (an npx line), generic (command, args, env)")
    mc.add_argument("--transport", choices=["stdio", "http"], default="stdio",
                    help="stdio: the client starts the server; http: the client connects to a running one")
    mc.add_argument("--port", type=int, default=8000, help="the HTTP server's port (--transport http)")
    mc.add_argument("--name", default="toolgraph", help="the server's name in the client's config")
    mc.set_defaults(fn=cmd_mcp_config)

    i = sub.add_parser("index", help="maintain a saved agent/tool index: sync a catalog, learn from a usage log, "
                                     "train on it")
    i.add_argument("action", choices=["sync", "feedback", "train"])
    i.add_argument("catalog", nargs="?", default=None, metavar="CATALOG | LOG",
                   help="sync: MCP servers JSON, a folder of tools/list responses, or a dataset folder; feedback: "
                        'the usage log, JSON lines {"query", "tools": [ids], "ok"?, "time"?}')
    i.add_argument("--index", required=True,
                   help="index folder (created if missing or empty, replaced atomically; any other folder is refused)")
    i.add_argument("--retriever-config", default=None,
                   help="YAML retriever config for a new index (default: t2a over toolgraph-general, all-MiniLM-L6-v2 when it is not installed)")
    i.add_argument("--wait", type=float, default=60.0,
                   help="seconds to wait while another sync of the same index runs (0: fail at once)")
    i.add_argument("--on-duplicate", choices=["error", "keep-first", "keep-last"], default="error",
                   help="a tool name repeated inside one server: error (default), or keep one copy (counted)")
    i.add_argument("--max-text-chars", type=_positive_int, default=None,
                   help="longest name, description or inputSchema (as JSON) of one catalog entry (default 65536)")
    i.add_argument("--remove", action="store_true", help="feedback: delete stored entries (--query, --before)")
    i.add_argument("--query", action="append", default=None,
                   help="feedback --remove: the logged request to delete (case and spacing ignored; repeatable)")
    i.add_argument("--before", default=None,
                   help="feedback --remove: delete entries logged before this time (ISO 8601 or Unix seconds)")
    i.add_argument("--cap", type=_positive_int, default=None,
                   help="feedback: the store's size limit, kept in the index (oldest dropped first; default 200000)")
    i.add_argument("--config", default="configs/index_train.yaml", help="train: the training recipe")
    i.add_argument("--out", default=None, help="train: run folder (default: INDEX.train beside the index)")
    i.add_argument("--min-queries", type=_positive_int, default=1000,
                   help="train: refuse below this many successful logged queries (default 1000)")
    i.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="train: an override of the recipe (repeatable), e.g. --set trainer.max_time=00:00:10:00")
    i.set_defaults(fn=cmd_index)

    en = sub.add_parser("encoder", help="build an encoder: 'encoder static --out DIR' distils a static one "
                                        "(a token table, ~1,000x faster on CPU) from a transformer")
    en.add_argument("kind", choices=["static"])
    en.add_argument("--out", required=True, help="the model folder to write (retriever.encoder: DIR)")
    en.add_argument("--from", dest="source", default="all-MiniLM-L6-v2", help="the transformer to distil")
    en.add_argument("--sif", type=float, default=1e-3, help="SIF constant a of the token weights a/(a+p)")
    en.add_argument("--drop", type=_count, default=16, help="principal components removed from the table")
    en.set_defaults(fn=cmd_encoder)

    mo = sub.add_parser("models", help="build (train + install) or install a model toolgraph ships by name: general")
    mo.add_argument("action", choices=["build", "install"])
    mo.add_argument("name", choices=["general"], help="general: toolgraph-general (docs/general.md)")
    mo.add_argument("overrides", nargs="*", help="build: training config key=value (trainer.max_steps=100 out_dir=...)")
    mo.add_argument("--config", default=None, help="build: another training config (default: the model's recipe, "
                                                      "configs/general.yaml)")
    mo.add_argument("--run", default="runs/general", help="install: the run folder whose retriever/encoder to install")
    mo.set_defaults(fn=cmd_models)

    dr = sub.add_parser("doctor", help="versions, devices, data and model paths, and the fix for what is missing")
    dr.add_argument("--json", action="store_true", help="the checks as JSON")
    dr.set_defaults(fn=cmd_doctor)

    sw = sub.add_parser("sweep", help="run a W&B-format sweep spec on Optuna (workers, pruning, resume); "
                                      "'sweep report STUDY' reports one")
    add_sweep_args(sw)
    sw.set_defaults(fn=cmd_sweep)

    r = sub.add_parser("report", help="print the metrics table of evaluation folders (--html: a comparison page)")
    r.add_argument("dirs", nargs="+")
    r.add_argument("--html", default=None, help="also write one self-contained HTML page comparing the runs")
    r.add_argument("-k", type=int, default=5, help="K of the per-query wins/losses and misses (--html)")
    r.add_argument("--ci", action="store_true",
                   help="95 %% bootstrap interval of --metric for each run, and each run's paired difference from "
                        "the first (interval, p-value), from the runs' rankings.jsonl")
    r.add_argument("--metric", default="recall@5", help="the metric of --ci (recall@5, ndcg@10, pass@3, mrr, ...)")
    r.add_argument("--samples", type=_positive_int, default=10000, help="bootstrap resamples of --ci")
    r.set_defaults(fn=cmd_report)
    return p


def _gpu_list(text: str) -> list[str]:
    items = [g.strip() for g in text.split(",") if g.strip()]
    if not items or not all(g.isdigit() for g in items):
        raise argparse.ArgumentTypeError(f"expected GPU indices such as 0,1,2,3, got {text!r}")
    return items


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def add_sweep_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("target", nargs="*", metavar="SPEC | report STUDY",
                   help="a sweep spec (configs/sweeps/*.yaml, W&B's format), or 'report' and a study (its sweep folder, "
                        "or its name with --storage)")
    s.add_argument("--worker", metavar="STUDY", default=None,
                   help="join an existing study as one worker (its sweep folder, or its name with --storage)")
    s.add_argument("--out", default=None, help="sweep folder (default runs/sweeps/NAME): the journal, trials/, report")
    s.add_argument("--storage", default=None,
                   help="a journal file (default: SWEEP/study.journal) or an SQLAlchemy URL (postgresql://...)")
    s.add_argument("--study", default=None, help="the study's name (default: the spec's name, else its file name)")
    s.add_argument("--workers", type=_count, default=None,
                   help="trials at once on this machine, each worker on its share of the cores (default 1, or one "
                        "per GPU with --gpus); 0: create the study and start no worker")
    s.add_argument("--gpus", type=_gpu_list, default=None, help="GPU indices shared out to the workers (0,1,2,3)")
    s.add_argument("--trials", type=_positive_int, default=None, help="trials of a random / bayes sweep (run_cap)")
    s.add_argument("--pruner", default=None, choices=["none", "median", "halving", "hyperband"],
                   help="stop bad trials early (default: the spec's early_terminate, else none)")
    s.add_argument("--prune-startup", type=_count, default=3, help="median: trials finished before any is pruned")
    s.add_argument("--prune-warmup", type=_count, default=1, help="validations of a trial before it may be pruned")
    s.add_argument("--order", choices=["product", "shuffled"], default="product",
                   help="grid order: product (W&B's, first key outermost) or shuffled by --seed (as Optuna's "
                        "GridSampler; a pruner then meets good and bad points early)")
    s.add_argument("--resume", action="store_true", help="continue the study if it exists (else create it)")
    s.add_argument("--seed", type=int, default=None, help="sampler seed of random / bayes (worker i: seed + i)")
    s.add_argument("--grace", type=float, default=120.0,
                   help="seconds without a heartbeat after which another worker re-runs a trial")


def cmd_sweep(args: argparse.Namespace) -> int:
    from toolgraph.sweep import run

    target = list(args.target)
    if args.worker is not None:
        if target:
            raise ToolgraphError(f"--worker joins a study: drop {' '.join(target)}")
        run.join(args.worker, args.storage, grace=args.grace, seed=args.seed)
        return 0
    if target[:1] == ["report"]:
        if len(target) != 2:
            raise ToolgraphError("usage: toolgraph sweep report STUDY [--storage URL] [--out DIR]")
        name, storage, folder = run.locate(target[1], args.storage)
        from toolgraph.sweep.study import open_sweep

        sweep = open_sweep(name, storage, folder, wait=0)
        run.finish(sweep, Path(args.out) if args.out else None)
        return 0
    if len(target) != 1:
        raise ToolgraphError("usage: toolgraph sweep SPEC.yaml [options] | --worker STUDY | report STUDY")
    workers = args.workers if args.workers is not None else (len(args.gpus) if args.gpus else 1)
    run.start(target[0], out=args.out, storage=args.storage, study=args.study, workers=workers, gpus=args.gpus,
              trials=args.trials, pruner=args.pruner, prune_startup=args.prune_startup,
              prune_warmup=args.prune_warmup, resume=args.resume, seed=args.seed, grace=args.grace,
              order=args.order)
    return 0


def add_evaluate_args(e: argparse.ArgumentParser) -> None:
    e.add_argument("--config", action="append", default=[], help="YAML file (repeatable, later wins)")
    e.add_argument("--out", default=None, help="output folder (evaluate: out, train: out_dir)")
    e.add_argument("--print-config", action="store_true", help="print the resolved config and exit (nothing runs)")
    e.add_argument("--checkpoint", default=None, help="evaluate: a .ckpt, exported retriever or run folder")
    e.add_argument("overrides", nargs="*", help="key=value or --key=value")


def main(argv: Sequence[str] | None = None) -> int:
    _offline_defaults()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # sweep agents pass --key=value: keep those as overrides, reject other unknown flags
    # (and key=value after options, which argparse leaves over once the positionals were taken)
    extra = [u for u in unknown if "=" in u and (u.startswith("--") or not u.startswith("-"))]
    if len(extra) != len(unknown):
        parser.error(f"unrecognized arguments: {' '.join(u for u in unknown if u not in extra)}")
    if extra:
        if not hasattr(args, "overrides"):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    from toolgraph.runs import Terminated, install_signal_handlers, received_signal, restore_signal_handlers

    previous = install_signal_handlers() if args.fn is not cmd_serve else {}  # the server handles its own
    try:
        return args.fn(args)
    except ToolgraphError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated, SystemExit) as e:
        # SIGINT / SIGTERM (also when Lightning turned them into SystemExit): temp files are removed and
        # results.json is written last, so nothing is half-written; exit 128 + signal
        signum = received_signal() or (signal.SIGINT if isinstance(e, KeyboardInterrupt) else None)
        if signum is None:
            raise
        name = signal.Signals(signum).name
        print(f"interrupted ({name}): stopped; nothing was half-written, an interrupted run has no "
              "results.json (re-run it)", file=sys.stderr)
        return 128 + int(signum)
    finally:  # called from Python (a test, a notebook): the caller's handlers again
        restore_signal_handlers(previous)


if __name__ == "__main__":
    sys.exit(main())
