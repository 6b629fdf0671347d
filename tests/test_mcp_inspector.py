"""The official MCP Inspector CLI (``npx @modelcontextprotocol/inspector --cli``), at its default
timeouts, lists and calls the tools of ``toolgraph serve`` over stdio, started by the line ``toolgraph
mcp-config --client inspector`` prints (the environment's absolute ``toolgraph``). Skipped, saying
why, where npx is absent or cannot fetch the package (the first run downloads it from npm)."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_serving import spec

from toolgraph.sync import sync_index

REPO = Path(__file__).resolve().parents[1]
OFFLINE_NPM = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "network", "E404", "403 Forbidden")


@pytest.fixture(scope="module")
def inspector_line(tiny_bert_dir, tmp_path_factory) -> list[str]:
    if shutil.which("npx") is None:
        pytest.skip("npx is not installed (Node.js): the MCP Inspector CLI runs with npx")
    from conftest import write_mcp_catalog

    folder = tmp_path_factory.mktemp("inspector")
    catalog, _ = write_mcp_catalog(folder / "catalog")
    sync_index(catalog, folder / "idx", spec(tiny_bert_dir))  # t2a over the tiny random BERT
    printed = subprocess.run([sys.executable, "-m", "toolgraph.cli", "mcp-config", "--retriever", str(folder / "idx"),
                              "--client", "inspector"], env={**os.environ, "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    line = shlex.split(printed.stdout)
    assert line[:4] == ["npx", "-y", "@modelcontextprotocol/inspector", "--cli"] and line[-2:] == ["--method", "tools/list"]
    return line


def inspector(line: list[str], *extra: str) -> dict:
    run = subprocess.run([*line, *extra], capture_output=True, text=True, timeout=900, cwd=REPO)
    out = run.stdout + run.stderr
    if run.returncode != 0 and ("npm ERR!" in out or "npm error" in out) and any(w in out for w in OFFLINE_NPM):
        pytest.skip(f"npx cannot fetch @modelcontextprotocol/inspector: {out.strip().splitlines()[-1][:200]}")
    assert run.returncode == 0, out[-3000:]
    return json.loads(run.stdout)


def test_the_inspector_cli_lists_and_calls_the_tools(inspector_line):
    listed = inspector(inspector_line)
    tools = {t["name"]: t for t in listed["tools"]}
    assert sorted(tools) == ["search_agents", "search_tools"]
    assert tools["search_tools"]["inputSchema"]["properties"]["query"]["description"]
    call = [*inspector_line[:-2], "--method", "tools/call", "--tool-name", "search_tools",
            "--tool-arg", "query=seven day weather forecast", "--tool-arg", "k=3"]
    result = inspector(call)
    assert not result.get("isError"), result
    found = result["structuredContent"]["result"]
    assert [r["rank"] for r in found] == [1, 2, 3] and all(r["name"] and r["agent"] for r in found)
    agents = inspector([*inspector_line[:-2], "--method", "tools/call", "--tool-name", "search_agents",
                        "--tool-arg", "query=book a flight", "--tool-arg", "k=2"])
    assert not agents.get("isError") and [a["rank"] for a in agents["structuredContent"]["result"]] == [1, 2]
