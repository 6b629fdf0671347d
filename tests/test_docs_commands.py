"""Every shell command shown in README.md and docs/*.md is checked, so a documented command cannot rot.

A command is a line of a ```bash (or sh, shell) block (lines ending in a backslash joined; blank and ``#`` lines
skipped). ``RULES`` gives it a kind, first match wins:

- ``run``: quick on real data, so it runs here verbatim with bash, in a temporary folder that holds
  the repository's configs/, benchmarks/, examples/, train.py, evaluate.py and .venv (``runs/...`` lands
  there), the way a reader runs it: in a fresh shell whose ``PATH`` has no virtual environment on it,
  after ``source .venv/bin/activate`` when the page says to (every page with commands must);
- ``resolve``: too long to run in a test (a training, a MiniLM evaluation, a benchmark); its configs,
  override keys and values load (the command with ``--print-config``, stopped where work would
  start), or a benchmark's arguments parse;
- ``covered``: needs a server or the output of an hour-long run; the named tests run the same CLI
  path on tiny models (the test checks they exist);
- ``gpu`` / ``cluster``: the docs line says so in a trailing comment, and its configs resolve;
- ``ci``: ``make test``, which CI runs itself;
- ``setup``: ``make install`` and ``source .venv/bin/activate``, what every run above starts from.

A command that no rule matches fails with its page and line: add a rule (or extend one) below.
"""

import argparse
import ast
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from toolgraph.data.loading import CHECKOUT_DATA

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}

# (regex over the command without its comment, kind, tests that cover it: "file.py::function").
# Ordered: the first match wins. A run must take seconds (MiniLM encodes ~75 texts/s on 2 cores).
ACTIVATE = "source .venv/bin/activate"
RULES: list[tuple[str, str, tuple[str, ...]]] = [
    (r"^make test$", "ci", ()),
    (r"^make install$|^source \.venv/bin/activate$", "setup", ()),
    (r"^make demo$", "resolve", ()),  # make -n demo: each python step resolves, the report reads their outputs
    (r"^torchrun .*--nnodes=(?!1 )\d|^(sbatch|srun) ", "cluster", ()),
    (r"--config configs/cluster/\d+gpu\.yaml", "gpu", ()),
    (r"^toolgraph data (list|stats|export|tdi build)( |$)", "run", ()),
    (r"^python evaluate\.py --config configs/(retriever|eval)/bm25[\w-]*\.yaml", "run", ()),
    # docs/your-own-catalog.md over examples/: a sync of 43 tools with MiniLM, BM25 on 28 labels (seconds)
    (r"^toolgraph index sync examples/servers\.json --index runs/example_index$", "run", ()),
    (r"^toolgraph retrieve --checkpoint runs/example_index ", "run", ()),
    (r"^toolgraph mcp-config --retriever runs/example_index( |$)", "run", ()),
    (r"^python evaluate\.py --config examples/eval_bm25\.yaml --out runs/\S+$", "run", ()),
    (r"^toolgraph mcp-config --retriever runs/mcp_index( |$)", "covered",
     ("test_mcp_config.py::test_each_client_gets_its_own_format",)),
    (r"^toolgraph serve --retriever \S+$", "covered", ("test_serving.py::test_mcp_over_stdio",)),
    (
        r"^toolgraph serve --retriever \S+ --transport http",
        "covered",
        ("test_serving.py::test_mcp_over_streamable_http_and_json_routes",),
    ),
    (
        r"^curl \S*http://127\.0\.0\.1:\d+/search",
        "covered",
        ("test_serving.py::test_mcp_over_streamable_http_and_json_routes",),
    ),
    (
        r"^toolgraph index sync ",
        "covered",
        (
            "test_serving.py::test_sync_counts_and_cli",
            "test_serving.py::test_sync_cli_creates_an_index_from_a_retriever_config",
            "test_sync_safety.py::test_an_empty_folder_may_be_used_and_created_is_true_only_when_created",
            "test_sync_retrievers.py::test_a_bm25_index_is_created_and_updated_by_the_shipped_config",
        ),
    ),
    (
        r"^toolgraph retrieve --checkpoint runs/\S+ --graph ",
        "covered",
        ("test_training.py::test_retrieve_with_a_dependency_graph_brings_the_prerequisite_up",),
    ),
    (
        r"^toolgraph retrieve --checkpoint runs/",
        "covered",
        ("test_training.py::test_retrieve_command_prints_top_tools",),
    ),
    (
        r"^python evaluate\.py --checkpoint runs/",
        "covered",
        ("test_training.py::test_evaluate_with_checkpoint_uses_the_runs_data",),
    ),
    (r"^toolgraph graph build --discriminator runs/", "covered", ("test_depgraph.py::test_cli_graph_build",)),
    (
        r"^toolgraph export --checkpoint runs/\S+ --out runs/\S+ --graph ",
        "covered",
        ("test_training.py::test_export_with_a_graph_writes_a_tgr_folder_that_loads_for_serving",),
    ),
    (
        r"^toolgraph depgraph build --discriminator runs/",
        "covered",
        ("test_depgraph.py::test_cli_depgraph_build_with_schema_and_usage_blocking",),
    ),
    (  # the folders come from MiniLM evaluations and trainings (minutes to an hour here)
        r"^toolgraph report runs/",
        "covered",
        (
            "test_docs_commands.py::test_report_prints_the_table_of_evaluation_folders",
            "test_report.py::test_the_page_loads_in_headless_chromium_without_errors",
            "test_report.py::test_ci_gives_intervals_and_the_paired_difference",
        ),
    ),
    # docs/configuration.md "Sweeps": each toolgraph sweep path runs for real on the tiny model (tests/test_sweep.py)
    (r"^toolgraph sweep \S+\.yaml --workers \d+$", "covered",
     ("test_sweep.py::test_two_workers_on_one_journal_finish_a_six_point_grid_running_no_point_twice",)),
    (r"^toolgraph sweep \S+\.yaml .*--gpus ", "gpu", ()),
    (r"^toolgraph sweep \S+\.yaml --pruner median ", "covered",
     ("test_sweep.py::test_the_median_pruner_stops_a_trial_worse_than_the_median_and_keeps_its_folder",)),
    (r"^toolgraph sweep \S+\.yaml --resume$", "covered",
     ("test_sweep.py::test_sigterm_requeues_the_trial_and_resume_continues_it_from_last_ckpt",)),
    (r"^toolgraph sweep \S+\.yaml --storage postgresql://\S+ --workers 0$|^toolgraph sweep --worker \S+( --storage |$)",
     "covered", ("test_sweep.py::test_two_workers_share_a_study_in_postgresql",
                 "test_sweep.py::test_a_worker_killed_by_sigkill_leaves_its_trial_failed_and_the_other_worker_re_runs_it")),
    (r"^toolgraph sweep report runs/sweeps/\S+$", "covered",
     ("test_sweep_report.py::test_the_table_has_a_row_per_trial_and_marks_the_best_the_lowest_number_winning_a_tie",
      "test_sweep_report.py::test_the_page_renders_in_headless_chromium_without_errors")),
    (r"^python train\.py --config runs/sweeps/\S+/best\.yaml$", "covered",
     ("test_sweep_report.py::test_best_yaml_loads_back_with_the_best_params_and_out_dir",)),
    (r"^(python (train|evaluate)\.py|toolgraph (train|evaluate|tune)) ", "resolve", ()),
    # docs/agents-and-serving.md "Learning from usage": the CLI paths on the tiny model (tests/test_feedback.py)
    (r"^toolgraph index feedback ", "covered",
     ("test_feedback.py::test_remove_by_query_and_by_time_and_the_cap_drops_the_oldest",
      "test_feedback.py::test_a_running_server_picks_up_a_feedback_swap_with_no_failed_request")),
    (r"^toolgraph index train ", "covered",
     ("test_feedback.py::test_index_train_swaps_in_a_model_trained_on_the_log_and_keeps_the_log",)),
    # docs/agents-and-serving.md "Registry scale": the static encoder and the streaming / split sync (tests/test_scale.py)
    (r"^toolgraph encoder static ", "covered",
     ("test_static_encoder.py::test_the_cli_distils_one_with_weights_counted_on_the_real_catalogs",)),
    # docs/general.md "Serving it by name": the shipped recipe a few steps on the tiny model, installed (tests/test_models.py)
    (r"^toolgraph models (build|install) general( |$)", "covered",
     ("test_models.py::test_models_build_general_trains_the_recipe_and_installs_it_by_name",
      "test_models.py::test_models_install_refuses_a_run_without_an_encoder_and_a_folder_that_is_not_a_model")),
    # docs/general.md "A second encoder": the five wheels joined into the model cache, resolved by name
    (r"^make mpnet$", "covered", ("test_packaged.py::test_parts_are_joined_once_into_the_cache_and_the_folder_loads",
                                  "test_packaged.py::test_the_name_resolves_to_the_cache_folder")),
    (r"^torchrun --standalone --nproc_per_node=\d+ -m toolgraph\.cli index sync ", "covered",
     ("test_scale.py::test_torchrun_splits_a_sync_s_encoding_over_two_ranks",)),
    (r"^python benchmarks/\w+\.py( |$)", "resolve", ()),
]
MARK_WORDS = {"gpu": r"\bgpus?\b", "cluster": r"\bcluster\b"}  # what a gpu / cluster line's comment must say


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    command: str  # without the comment
    comment: str
    activated: bool = False  # the page says to run its commands after ``source .venv/bin/activate``

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def rule(self) -> tuple[str, str, tuple[str, ...]] | None:
        return next((r for r in RULES if re.search(r[0], self.command)), None)

    @property
    def kind(self) -> str | None:
        return self.rule[1] if self.rule else None


def split_comment(text: str) -> tuple[str, str]:
    """``cmd  # note`` -> ("cmd", "note"); a ``#`` inside quotes or inside a word is not a comment."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].strip(), text[i + 1 :].strip()
    return text.strip(), ""


def docs_commands() -> list[Command]:
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        activated = ACTIVATE in text
        lines = text.splitlines()
        in_bash, i = False, 0
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith("```"):
                in_bash = not in_bash and stripped[3:].strip() in ("bash", "sh", "shell")
            elif in_bash and stripped and not stripped.startswith("#"):
                start, text = i + 1, stripped
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i].strip()
                out.append(Command(page.relative_to(ROOT).as_posix(), start, *split_comment(text), activated))
            i += 1
    return out


COMMANDS = docs_commands()


def _marks(cmd: Command) -> list:
    return [pytest.mark.realdata, pytest.mark.slow] if cmd.kind == "run" else []


# ---------------------------------------------------------------------------------------------------------------
# the rule table


def test_the_docs_show_commands_and_every_one_is_classified():
    assert len(COMMANDS) >= 50 and {c.page for c in COMMANDS} >= {"README.md", "docs/getting-started.md"}
    unclassified = [f"{c.where}: {c.command}" for c in COMMANDS if c.kind is None]
    assert not unclassified, "classify these docs commands in RULES of tests/test_docs_commands.py:\n" + "\n".join(
        unclassified
    )


def test_every_page_with_commands_says_how_they_run():
    """A reader's fresh shell has no virtual environment: ``python`` lacks torch and ``toolgraph`` is not a
    command until ``source .venv/bin/activate``. Every page showing commands other than ``make ...`` says so."""
    silent = sorted({c.page for c in COMMANDS if not c.activated and not c.command.startswith("make ")})
    assert not silent, f"these pages show commands but never say `{ACTIVATE}`: {silent}"


def test_every_rule_matches_a_docs_command():
    used = {c.rule[0] for c in COMMANDS if c.rule}
    assert not [r for r, _, _ in RULES if r not in used], "rules no docs command uses: remove them"


def test_split_comment():
    assert split_comment('curl "http://h/s?q=a#b&k=5"   # JSON; also /health') == (
        'curl "http://h/s?q=a#b&k=5"',
        "JSON; also /health",
    )
    assert split_comment("make demo") == ("make demo", "")


# ---------------------------------------------------------------------------------------------------------------
# resolving a command: everything up to the point where its work would start


class Resolved(Exception):
    """Raised where a stubbed command would start its work; carries the resolved config (or parsed args)."""

    def __init__(self, value):
        super().__init__("resolved")
        self.value = value


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder where the docs' relative paths (configs/..., benchmarks/..., train.py) resolve."""
    work = tmp_path_factory.mktemp("docs-commands")
    for name in ("configs", "benchmarks", "examples", "train.py", "evaluate.py"):
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    return work


def resolve_cli(argv: list[str], monkeypatch, capsys):
    """``toolgraph <argv>`` up to its config: train / evaluate stop where training or the dataset would
    start, after ``--print-config`` printed the resolved YAML (returned as a dict); graph build stops
    where the dataset would load."""
    import toolgraph.data
    import toolgraph.retrieval.loading  # noqa: F401
    import toolgraph.training
    from toolgraph.cli import main
    from toolgraph.registry import DATASETS, TASKS

    # every module that binds prepare_dataset by name (the tasks, the retriever loader) is imported before the
    # stubs go in: one first imported under them would keep the stub for the rest of the session
    TASKS.names()

    def stop(value, *args, **kwargs):
        raise Resolved(value)

    monkeypatch.setattr(toolgraph.training, "train", stop)
    monkeypatch.setattr(toolgraph.data, "prepare_dataset", stop)
    monkeypatch.setattr(toolgraph.data, "load_dataset", stop)
    if argv[0] in ("train", "evaluate", "tune") and "--print-config" not in argv:
        argv = [*argv, "--print-config"]
    printing = argv[0] in ("train", "evaluate", "tune")
    try:
        rc = main(argv)
    except Resolved as r:
        stopped_at = r.value
    else:  # --print-config prints the resolved config and stops there
        if rc != 0 or not printing:
            pytest.fail(f"toolgraph {shlex.join(argv)} exited {rc} before its work: {capsys.readouterr().err[-2000:]}")
    if not printing:  # graph build: load_dataset's first argument is the dataset
        cfg, name = {}, stopped_at
    else:
        cfg = yaml.safe_load(capsys.readouterr().out)
        assert isinstance(cfg, dict) and "data" in cfg, f"--print-config printed no config: {cfg}"
        name = cfg["data"]["name"]
    if cfg.get("model", {}).get("name") not in ("discriminator", "discriminator_schema"):  # data.name=tdi: pairs
        assert name in DATASETS.names() or Path(name).is_dir(), f"{name!r} is not a registered dataset"
    return cfg


def resolve_benchmark(args: list[str], monkeypatch, capsys):
    """``python benchmarks/X.py <args>``: the script's own parser accepts the arguments (stopped there)."""
    script = ROOT / args[0]
    spec = importlib.util.spec_from_file_location(f"_benchmark_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parse = argparse.ArgumentParser.parse_args

    def stop(self, *a, **k):
        raise Resolved(parse(self, *a, **k))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    monkeypatch.setattr(sys, "argv", [str(script), *args[1:]])
    try:
        module.main()
    except Resolved as r:
        return r.value
    except SystemExit as e:
        pytest.fail(f"python {shlex.join(args)}: exit {e.code}: {capsys.readouterr().err[-2000:]}")
    pytest.fail(f"python {shlex.join(args)} never parsed its arguments")


def resolve_make_demo(monkeypatch, capsys) -> None:
    """``make -n demo``: each python step resolves, and the report reads the folders those steps write."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    proc = subprocess.run(["make", "-n", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs, reported = [], None
    for line in proc.stdout.splitlines():
        argv = shlex.split(line)
        if Path(argv[0]).name == "python" and argv[1] in ("train.py", "evaluate.py"):
            cfg = resolve_cli([argv[1].removesuffix(".py"), *argv[2:]], monkeypatch, capsys)
            outputs.append(cfg["out_dir"] if argv[1] == "train.py" else cfg["out"])
        elif Path(argv[0]).name == "toolgraph" and argv[1] == "report":
            reported = argv[2:]
    assert len(outputs) >= 2 and reported == outputs, (outputs, reported)


def resolve(cmd: Command, monkeypatch, capsys) -> bool:
    """Resolve what can be resolved of ``cmd``; False when it is nothing this file knows how to resolve."""
    argv = shlex.split(cmd.command)
    configs = [b for a, b in zip(argv, argv[1:]) if a == "--config"]
    if cmd.kind == "covered" and any(c.startswith("runs/") for c in configs):
        return True  # its config is an output (a sweep's best.yaml): the covering test loads one it wrote
    if argv[0] == "torchrun" and "-m" in argv:  # a module: toolgraph.cli is the toolgraph command
        module = argv.index("-m") + 1
        argv = (["toolgraph"] if argv[module] == "toolgraph.cli" else ["python", "-m", argv[module]]) + argv[module + 1:]
    elif argv[0] == "torchrun":  # the launcher's own options, then the script
        argv = ["python", *argv[next(i for i, a in enumerate(argv) if a.endswith(".py")) :]]
    if argv[:2] == ["make", "demo"]:
        resolve_make_demo(monkeypatch, capsys)
    elif argv[0] == "python" and argv[1].startswith("benchmarks/"):
        resolve_benchmark(argv[1:], monkeypatch, capsys)
    elif argv[0] == "python" and argv[1] in ("train.py", "evaluate.py"):
        resolve_cli([argv[1].removesuffix(".py"), *argv[2:]], monkeypatch, capsys)
    elif argv[0] == "toolgraph" and argv[1] in ("train", "evaluate", "tune", "graph"):
        resolve_cli(argv[1:], monkeypatch, capsys)
    else:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# running the quick ones


def _paths(command: str) -> set[str]:
    """The files a command names (``runs/x``, ``out/y``, also as ``key=runs/x``), but not the repository's."""
    words = [w.rpartition("=")[2] for w in shlex.split(command)]
    return {w for w in words if "/" in w and not w.startswith(("configs/", "benchmarks/", "examples/", "http"))}


@pytest.fixture(scope="module")
def ran(data_root, tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """Each ``run`` command once (a command shown on several pages runs once) in one temporary folder,
    two at a time (the 2 cores CI has); a command that names a path an earlier one names (its output)
    starts after that one ends, so a producer must come first in the docs."""
    venv = ROOT / ".venv"
    if not (venv / "bin" / "activate").is_file():
        pytest.skip("the docs' commands run in the project's .venv: make install creates it")
    work = tmp_path_factory.mktemp("docs-run")
    for name in ("configs", "benchmarks", "examples", "train.py", "evaluate.py", ".venv"):
        if (ROOT / name).exists():
            (work / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH")}
    env.update(OFFLINE, PATH=fresh_path())
    env.pop("TOOLGRAPH_DATA", None)
    if data_root.resolve() != CHECKOUT_DATA:  # a checkout beside ../shared finds it, as the docs say
        env["TOOLGRAPH_DATA"] = str(data_root)

    def run(cmd: Command, after: list[Future]) -> subprocess.CompletedProcess:
        wait(after)
        line = f"{ACTIVATE} && {cmd.command}" if cmd.activated else cmd.command
        return subprocess.run(["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True, timeout=600)

    futures: dict[tuple[str, bool], Future] = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        for cmd in {(c.command, c.activated): c for c in COMMANDS if c.kind == "run"}.values():
            after = [f for (earlier, _), f in futures.items() if _paths(earlier) & _paths(cmd.command)]
            futures[cmd.command, cmd.activated] = pool.submit(run, cmd, after)
    return work, {key: f.result() for key, f in futures.items()}


def fresh_path() -> str:
    """``PATH`` as a new login shell has it: without any virtual environment's ``bin`` (this one's, or
    one activated in the shell that started pytest)."""
    venvs = {Path(sys.prefix) / "bin", ROOT / ".venv" / "bin"}
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not (Path(d) / "activate").is_file() and Path(d) not in venvs]
    return os.pathsep.join(keep or ["/usr/local/bin", "/usr/bin", "/bin"])


# ---------------------------------------------------------------------------------------------------------------
# each command


def _test_functions(file: str) -> set[str]:
    tree = ast.parse((ROOT / "tests" / file).read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


@pytest.mark.parametrize("cmd", [pytest.param(c, id=c.where, marks=_marks(c)) for c in COMMANDS])
def test_docs_command(cmd, request, workdir, monkeypatch, capsys):
    if cmd.kind is None:
        pytest.fail(f"{cmd.where}: `{cmd.command}` matches no rule: classify it in RULES of {Path(__file__).name}")
    if cmd.kind in MARK_WORDS:
        assert re.search(MARK_WORDS[cmd.kind], cmd.comment, re.I), (
            f"{cmd.where}: a {cmd.kind} command; end the docs line with a comment saying so (# {cmd.kind.upper()})"
        )
    if cmd.kind == "ci":
        assert re.search(r"^test:.*\n(\t.*\n)*\t.*pytest", (ROOT / "Makefile").read_text(), re.M)
    elif cmd.kind == "setup":  # make install makes the .venv that the activate line enters
        makefile = (ROOT / "Makefile").read_text()
        assert re.search(r"^install:", makefile, re.M) and re.search(r"^VENV\s*:?=\s*\.venv$", makefile, re.M)
    elif cmd.kind == "covered":
        missing = [t for t in cmd.rule[2] if t.partition("::")[2] not in _test_functions(t.partition("::")[0])]
        assert cmd.rule[2] and not missing, f"{cmd.where}: no such tests {missing}"
    elif cmd.kind == "run":
        work, results = request.getfixturevalue("ran")
        proc = results[cmd.command, cmd.activated]
        assert proc.returncode == 0, f"{cmd.where}: `{cmd.command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}"
        argv = shlex.split(cmd.command)
        if "--out" in argv:
            assert (work / argv[argv.index("--out") + 1] / "results.json").is_file()
    monkeypatch.chdir(workdir)
    if cmd.kind != "run":  # gpu, cluster and covered commands resolve where they can; a resolve command must
        assert resolve(cmd, monkeypatch, capsys) or cmd.kind != "resolve", f"{cmd.where}: nothing resolves it"


# ---------------------------------------------------------------------------------------------------------------
# CLI paths of docs commands that no other test runs


def test_report_prints_the_table_of_evaluation_folders(tiny_dataset_dir, tmp_path, capsys):
    """``toolgraph report A B`` (and ``--html``) over two evaluation folders."""
    from toolgraph.cli import main

    runs = {tmp_path / "bm25": [], tmp_path / "bm25_k1": ["retriever.k1=0.5"]}
    for out, overrides in runs.items():
        assert (
            main(["evaluate", f"data.name={tiny_dataset_dir}", "retriever.name=bm25", *overrides, "--out", str(out)])
            == 0
        )
    capsys.readouterr()
    assert main(["report", *map(str, runs), "--html", str(tmp_path / "report.html")]) == 0
    printed = capsys.readouterr().out
    assert "bm25 (bm25)" in printed and "bm25 (bm25_k1)" in printed and "recall@5" in printed
    assert (tmp_path / "report.html").stat().st_size > 1000
