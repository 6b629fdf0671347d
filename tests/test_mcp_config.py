"""``toolgraph mcp-config``: each client's configuration with absolute paths. The stdio config, spawned
as printed (command + args + env, with a PATH that does not hold the environment: a client starts
servers with its own PATH, where a bare ``toolgraph`` is "spawn toolgraph ENOENT") by the official
MCP Python SDK client, lists and calls the tools."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from test_serving_limits import bm25_index

from toolgraph.cli import main as cli
from toolgraph.cli import toolgraph_command

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def index(tmp_path, mcp_catalog):
    return bm25_index(tmp_path / "bm25", mcp_catalog[0])


def config(capsys, *argv: str) -> tuple[str, str]:
    assert cli(["mcp-config", *argv]) == 0
    out = capsys.readouterr()
    return out.out, out.err


async def list_and_call(params) -> tuple[list[str], dict]:
    from mcp import Client

    async with Client(params) as client:
        names = sorted(t.name for t in (await client.list_tools()).tools)
        result = await client.call_tool("search_tools", {"query": "seven day weather forecast", "k": 2})
        return names, result


def test_the_printed_stdio_config_starts_a_server_an_sdk_client_can_use(index, tmp_path):
    from mcp.client.stdio import StdioServerParameters

    relative = os.path.relpath(index, tmp_path)  # relative to where the command runs, printed absolute
    printed = subprocess.run([sys.executable, "-m", "toolgraph.cli", "mcp-config", "--retriever", relative,
                              "--client", "claude-desktop"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    server, hint = json.loads(printed.stdout)["mcpServers"]["toolgraph"], printed.stderr
    assert Path(server["command"]).is_absolute() and Path(server["command"]).exists()
    assert server["args"][-3:] == ["serve", "--retriever", str(index)]
    assert server["env"] == {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    assert "claude_desktop_config.json" in hint
    bare = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != bare) or "/usr/bin"
    params = StdioServerParameters(command=server["command"], args=server["args"], env={**server["env"], "PATH": path},
                                   cwd=str(tmp_path))
    names, result = anyio.run(list_and_call, params)
    assert names == ["search_agents", "search_tools"]
    assert not result.is_error and [r["rank"] for r in result.structured_content["result"]] == [1, 2]
    assert result.structured_content["result"][0]["name"]


def test_each_client_gets_its_own_format(index, capsys):
    command = toolgraph_command()
    argv = [*command[1:], "serve", "--retriever", str(index)]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = json.loads(config(capsys, "--retriever", str(index), "--client", "cursor")[0])
    assert out == {"mcpServers": {"toolgraph": {"command": command[0], "args": argv, "env": env}}}
    out = json.loads(config(capsys, "--retriever", str(index), "--client", "vscode", "--name", "tools")[0])
    assert out == {"servers": {"tools": {"type": "stdio", "command": command[0], "args": argv, "env": env}}}
    out = json.loads(config(capsys, "--retriever", str(index), "--client", "generic")[0])
    assert out == {"name": "toolgraph", "transport": "stdio", "command": command[0], "args": argv, "env": env}
    line = shlex.split(config(capsys, "--retriever", str(index), "--client", "claude-code")[0])
    assert line[:6] == ["claude", "mcp", "add", "--transport", "stdio", "toolgraph"]  # the name before --env
    assert line[6:11] == ["--env", "HF_HUB_OFFLINE=1", "--env", "TRANSFORMERS_OFFLINE=1", "--"]
    assert line[11:] == [*command, "serve", "--retriever", str(index)]
    line = shlex.split(config(capsys, "--retriever", str(index), "--client", "inspector")[0])
    assert line[:4] == ["npx", "-y", "@modelcontextprotocol/inspector", "--cli"]
    assert line[-2:] == ["--method", "tools/list"] and line[-2 - len(argv) - 1:-2] == [*command, *argv][-len(argv) - 1:]


def test_the_http_forms_name_the_url_and_say_how_to_start_the_server(index, capsys):
    url = "http://127.0.0.1:8123/mcp"
    out, hint = config(capsys, "--retriever", str(index), "--client", "vscode", "--transport", "http", "--port", "8123")
    assert json.loads(out) == {"servers": {"toolgraph": {"type": "http", "url": url}}}
    assert f"--retriever {index} --transport http --port 8123" in hint and hint.startswith("start the server first")
    out, _ = config(capsys, "--retriever", str(index), "--client", "cursor", "--transport", "http", "--port", "8123")
    assert json.loads(out) == {"mcpServers": {"toolgraph": {"url": url}}}
    out, _ = config(capsys, "--retriever", str(index), "--client", "claude-code", "--transport", "http", "--port", "8123")
    assert shlex.split(out) == ["claude", "mcp", "add", "--transport", "http", "toolgraph", url]
    out, _ = config(capsys, "--retriever", str(index), "--client", "inspector", "--transport", "http", "--port", "8123")
    assert url in shlex.split(out) and "--transport" in out
    assert cli(["mcp-config", "--retriever", str(index), "--transport", "http"]) == 2  # Claude Desktop: stdio only
    assert "starts stdio servers only" in capsys.readouterr().err
