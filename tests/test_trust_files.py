"""Issue 41 ("Trust"), findings 3, 4 and part of 9: a read never deletes anything, index sync keeps the
user's files and the folder's mode, and the catalog / index / disk corner cases end in clear errors.

Indexes are t2a over the tiny BERT (tests/conftest.py), built by ``sync_index`` in well under a second."""

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import MCP_SERVERS, write_mcp_catalog

from toolgraph.cli import main as cli
from toolgraph.data import load_dataset
from toolgraph.errors import ConfigError, DataError
from toolgraph.retrieval.loading import load as load_index
from toolgraph.sync import sync_index

RECIPES = {"name": "recipes", "description": "Cooking recipes", "category": "Food",
           "tools": [{"name": "find_recipe", "description": "vegan lasagna recipes", "inputSchema": {}}]}


def spec(tiny_bert_dir, cache: bool = False):
    dense = {"name": "dense", "model": str(tiny_bert_dir), "progress": False}
    if not cache:
        dense["cache_dir"] = None
    return {"name": "t2a", "scorer": "rrf", "dense": dense}


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def index(mcp_catalog, tiny_bert_dir, tmp_path):
    sync_index(mcp_catalog[0], tmp_path / "idx", spec(tiny_bert_dir))
    return tmp_path / "idx"


def backup(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


# ---- finding 3: a read deletes a user's folder -------------------------------------------------------
def test_loading_an_index_never_deletes_folders_beside_it(index, tmp_path, monkeypatch, capsys):
    """``.idx.old-nov`` is a user's backup (even one holding a copy of the index): no load, retrieve or
    server start may delete it, nor any other sibling that merely looks like a swap's old copy."""
    monkeypatch.chdir(tmp_path)
    mine = backup(tmp_path / ".idx.old-nov", {"retriever.json": "{}", "notes.txt": "november backup"})
    letters = backup(tmp_path / ".idx.old-12ab", {"retriever.json": "{}"})
    elsewhere = backup(tmp_path / "elsewhere", {"retriever.json": "{}", "keep.txt": "mine"})
    link = tmp_path / ".idx.old-77"
    link.symlink_to(elsewhere)
    before = {p: tree(p) for p in (mine, letters, elsewhere)}

    load_index(index)
    assert cli(["retrieve", "--checkpoint", str(index), "-k", "2", "weather in paris"]) == 0
    from toolgraph.serving import LiveIndex

    LiveIndex(index, check_every=0).close()
    capsys.readouterr()
    assert {p: tree(p) for p in (mine, letters, elsewhere)} == before  # nothing of the user's deleted
    assert link.is_symlink() and os.readlink(link) == str(elsewhere)


def test_only_the_swaps_own_old_copy_is_put_back_or_deleted(index, mcp_catalog, tmp_path):
    r = load_index(index)
    want = r.retrieve(["weather"], 2).ids
    os.rename(index, tmp_path / "kept-aside")
    mine = tmp_path / ".idx.old-nov"
    os.rename(tmp_path / "kept-aside", mine)  # the user's own copy under a name the swap never makes
    with pytest.raises(DataError, match="no such file or folder"):
        load_index(index)  # not restored: it is not ours to move
    assert mine.is_dir() and not index.exists()

    ours = tmp_path / ".idx.old-31337"  # what a crash between the two renames of a swap leaves
    os.rename(mine, ours)
    backup(mine, {"notes.txt": "november"})
    assert load_index(index).retrieve(["weather"], 2).ids == want  # put back by a rename
    assert index.is_dir() and not ours.exists() and (mine / "notes.txt").read_text() == "november"

    stale = tmp_path / ".idx.old-999"  # the swap had finished, only its delete was killed
    stale.mkdir()
    (stale / "retriever.json").write_text("{}")
    load_index(index)
    assert stale.is_dir()  # a loader never deletes ...
    sync_index(mcp_catalog[0], index)
    assert not stale.exists() and mine.is_dir()  # ... the next sync does, under the lock, and only its own


def test_a_loader_that_puts_the_index_back_mid_swap_loses_nothing(index, tmp_path, monkeypatch):
    """The one writer a loader's restore can meet: a sync between its two renames. The sync must fail
    cleanly (nothing changed, nothing left behind) and the old index stay live."""
    import toolgraph.files as files

    before = tree(index)
    catalog, _ = write_mcp_catalog(tmp_path / "v2", MCP_SERVERS + [RECIPES], [])
    real_rename = os.rename

    def rename(src, dst):
        real_rename(src, dst)
        if Path(dst).name.startswith(".idx.old-"):  # the swap's first rename: a reader loads right now
            assert files.recover_folder(index)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(DataError, match="put the index back while this sync swapped it.*not changed"):
        sync_index(catalog, index)
    monkeypatch.undo()
    assert tree(index) == before and len(load_index(index).tools) == 10
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".idx")) == []


# ---- finding 4: index sync deletes user files inside the index and resets the mode --------------------
def test_sync_carries_the_users_files_and_keeps_the_folder_mode(index, tmp_path, tiny_bert_dir):
    (index / "README.md").write_text("# our tool index\n")
    (index / ".gitignore").write_text("*.tmp\n")
    (index / "notes").mkdir()
    (index / "notes" / "todo.txt").write_text("add the recipes server")
    (index / "dense" / "WHY.md").write_text("tiny bert, for tests")  # inside a folder the retriever wrote
    (index / "latest").symlink_to("README.md")
    (index / ".retriever.json.tmp-12345").write_text("{half")  # a killed writer's temp file: not the user's
    os.chmod(index, 0o750)
    mine = {k: v for k, v in tree(index).items() if not k.startswith((".retriever", "latest"))
            and k in ("README.md", ".gitignore", "notes/todo.txt", "dense/WHY.md")}
    assert len(mine) == 4

    catalog, _ = write_mcp_catalog(tmp_path / "v2", MCP_SERVERS + [RECIPES], [])
    for _ in range(2):  # the carried files stay the user's (the new manifest does not list them): kept again
        counts = sync_index(catalog, index)
        assert {k: v for k, v in tree(index).items() if k in mine} == mine
        assert stat.S_IMODE(index.stat().st_mode) == 0o750
        assert (index / "latest").is_symlink() and os.readlink(index / "latest") == "README.md"
        assert not (index / ".retriever.json.tmp-12345").exists()
        manifest = json.loads((index / "manifest.json").read_text())
        assert not set(mine) & set(manifest["files"])
        assert len(load_index(index).tools) == 11  # the new index loads (its manifest checks out)
    assert counts["added"] == 0


def test_files_the_retriever_wrote_are_not_carried_as_stale_copies(index, tmp_path):
    from toolgraph.retrieval.manifest import write_manifest

    (index / "old_state.bin").write_bytes(b"\0" * 16)  # as if an older save wrote it ...
    write_manifest(index, "t2a", 10)  # ... and listed it in its manifest
    (index / "README.md").write_text("mine")
    sync_index(tmp_path / "mcp" / "servers.json", index)
    assert not (index / "old_state.bin").exists() and (index / "README.md").read_text() == "mine"


def test_a_user_file_under_a_name_the_new_index_writes_is_refused(index, tmp_path):
    manifest = json.loads((index / "manifest.json").read_text())
    del manifest["files"]["agents.jsonl"]  # agents.jsonl is then not the index's file but someone else's
    (index / "manifest.json").write_text(json.dumps(manifest))
    before = tree(index)
    with pytest.raises(ConfigError, match=r"'agents.jsonl' is not a file of the index.*move it out.*nothing was "
                                          r"changed"):
        sync_index(tmp_path / "mcp" / "servers.json", index)
    assert tree(index) == before and not list(tmp_path.glob(".idx.new-*"))


def test_an_index_without_a_manifest_refuses_rather_than_guess_which_files_are_yours(index, tmp_path):
    for m in index.rglob("manifest.json"):  # as an index saved before manifests existed
        m.unlink()
    (index / "README.md").write_text("mine")
    before = tree(index)
    with pytest.raises(ConfigError, match=r"has no manifest.json.*README.md.*Move your files out.*nothing was changed"):
        sync_index(tmp_path / "mcp" / "servers.json", index)
    assert tree(index) == before
    (index / "README.md").unlink()
    assert sync_index(tmp_path / "mcp" / "servers.json", index)["encoded"] == 0  # nothing unknown: it syncs
    assert (index / "manifest.json").is_file()


# ---- finding 9: the WEAK ones ---------------------------------------------------------------------------
@pytest.mark.parametrize("servers, match", [
    ([{"name": "a", "tools": [{"name": "b::c"}]}], r"server 'a' tool 'b::c': a tool name may not hold '::'"),
    ([{"name": "a::b", "tools": [{"name": "c"}]}], r"server 'a::b': a server name may not hold '::'"),
    ([{"name": "a:", "tools": [{"name": "b"}]}], r"server 'a:': a server name may not hold '::' or end with ':'"),
])
def test_names_that_could_make_another_tools_id_are_refused(tmp_path, servers, match):
    """``a`` + ``b::c`` and ``a::b`` + ``c`` would both be ``a::b::c``; ``a:`` + ``b`` and ``a`` + ``:b`` both
    ``a:::b``."""
    s, t = write_mcp_catalog(tmp_path, servers + [{"name": "z", "tools": [{"name": "ok"}]}], [])
    for kw in ({}, {"on_duplicate": "keep-first"}):
        with pytest.raises(DataError, match=match) as e:
            load_dataset("mcp", tmp_path, servers=str(s), **kw)
        assert str(s) in str(e.value)
    tools_lists = tmp_path / "lists"
    tools_lists.mkdir()
    (tools_lists / "x::y.json").write_text(json.dumps({"tools": [{"name": "t"}]}))
    with pytest.raises(DataError, match=r"x::y\.json: server 'x::y': a server name may not hold '::'"):
        load_dataset("mcp", tmp_path, tools_lists=str(tools_lists))


def test_catalog_text_over_the_limit_is_refused_and_the_limit_can_be_raised(tmp_path, tiny_bert_dir, capsys):
    long = {"name": "big", "description": "Big", "tools": [
        {"name": "ok", "description": "fine", "inputSchema": {}},
        {"name": "huge", "description": "x" * 70_000, "inputSchema": {}}]}
    s, _ = write_mcp_catalog(tmp_path / "c", [long], [])
    with pytest.raises(DataError, match=r"server #0 \('big'\): tools\['tools'\]\[1\] \('huge'\): 'description' is "
                                        r"70,000 characters, over the limit of 65,536.*max_text_chars") as e:
        load_dataset("mcp", s.parent, servers=str(s))
    assert str(s) in str(e.value)
    assert len(load_dataset("mcp", s.parent, servers=str(s), max_text_chars=100_000).tools) == 2

    schema = {"name": "s", "tools": [{"name": "t", "inputSchema": {"properties": {"p": {"enum": ["v" * 50] * 40}}}}]}
    s2, _ = write_mcp_catalog(tmp_path / "c2", [schema], [])
    with pytest.raises(DataError, match=r"'inputSchema' is 2,\d{3} characters, over the limit of 1,000"):
        load_dataset("mcp", s2.parent, servers=str(s2), max_text_chars=1000)
    name = {"name": "s" * 2000, "tools": [{"name": "t"}]}
    s3, _ = write_mcp_catalog(tmp_path / "c3", [name], [])
    with pytest.raises(DataError, match=r"server #0: 'name' is 2,000 characters") as e:
        load_dataset("mcp", s3.parent, servers=str(s3), max_text_chars=1000)
    assert len(str(e.value)) < 600  # the name itself is not quoted back

    cfg = tmp_path / "retriever.yaml"
    cfg.write_text(json.dumps({"retriever": spec(tiny_bert_dir)}))
    idx = tmp_path / "idx"
    assert cli(["index", "sync", str(s), "--index", str(idx), "--retriever-config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "over the limit" in err and "--max-text-chars" in err and "Traceback" not in err and not idx.exists()
    assert cli(["index", "sync", str(s), "--index", str(idx), "--retriever-config", str(cfg),
                "--max-text-chars", "100000"]) == 0
    assert json.loads(capsys.readouterr().out)["tools"] == 2


def test_an_index_given_as_a_symlink_stays_a_link(mcp_catalog, tiny_bert_dir, tmp_path):
    real = tmp_path / "store" / "real-index"
    real.mkdir(parents=True)
    link = tmp_path / "idx"
    link.symlink_to(real)
    assert sync_index(mcp_catalog[0], link, spec(tiny_bert_dir))["created"]
    catalog, _ = write_mcp_catalog(tmp_path / "v2", MCP_SERVERS + [RECIPES], [])
    counts = sync_index(catalog, link)
    assert counts["added"] == 2 and counts["index"] == str(link)
    assert link.is_symlink() and os.readlink(link) == str(real)  # the link is still the link ...
    assert len(load_index(real).tools) == 11  # ... and the folder it points to holds the new index
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert sorted(p.name for p in real.parent.iterdir()) == ["real-index"]

    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="a symlink to .*nowhere.*which does not exist"):
        sync_index(mcp_catalog[0], dangling, spec(tiny_bert_dir))
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()


def test_an_empty_catalog_is_a_clear_error(tmp_path, capsys):
    empty = tmp_path / "servers.json"
    empty.write_text("[]")
    idx = tmp_path / "idx"
    assert cli(["index", "sync", str(empty), "--index", str(idx)]) == 2
    err = capsys.readouterr().err
    assert str(empty) in err and "no tools" in err and "Traceback" not in err and not idx.exists()
    no_tools = tmp_path / "servers2.json"
    no_tools.write_text(json.dumps([{"name": "s", "tools": []}]))
    with pytest.raises(DataError, match="the catalog has no tools"):
        load_dataset("mcp", tmp_path, servers=str(no_tools))
    folder = tmp_path / "canonical"
    folder.mkdir()
    (folder / "tools.jsonl").write_text("")
    (folder / "queries.jsonl").write_text("")
    assert cli(["index", "sync", str(folder), "--index", str(idx)]) == 2
    err = capsys.readouterr().err
    assert "tools.jsonl" in err and "Traceback" not in err


def test_keep_first_prints_how_many_repeats_were_skipped(tmp_path, tiny_bert_dir, capsys):
    servers = [dict(MCP_SERVERS[3], tools={
        "ddg": {"tools": [{"name": "search", "description": "web search"}, {"name": "fetch_page"}]},
        "ddg-copy": {"tools": [{"name": "search", "description": "second copy"}]}})]
    s, _ = write_mcp_catalog(tmp_path / "c", servers, [])
    cfg = tmp_path / "retriever.yaml"
    cfg.write_text(json.dumps({"retriever": spec(tiny_bert_dir)}))
    assert cli(["index", "sync", str(s), "--index", str(tmp_path / "idx"), "--retriever-config", str(cfg),
                "--on-duplicate", "keep-first"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["skipped"] == {"repeated tool inside a server (first kept)": 1}
    assert "skipped 1 catalog entries" in err


def test_sync_writes_no_embedding_cache_outside_the_index(mcp_catalog, tiny_bert_dir, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    idx = tmp_path / "idx"
    sync_index(mcp_catalog[0], idx, spec(tiny_bert_dir, cache=True))  # dense.cache_dir: the default
    assert json.loads((idx / "dense" / "retriever.json").read_text())["config"]["encoder"]["cache_dir"] == ".cache/embeddings"
    catalog, _ = write_mcp_catalog(tmp_path / "v2", MCP_SERVERS + [RECIPES], [])
    assert sync_index(catalog, idx)["encoded"] == 2  # the new texts only: the index keeps its own vectors
    assert list(work.iterdir()) == []  # no ./.cache/embeddings


# ---- a full disk (a small tmpfs) ---------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of 16 MB, unmounted after the test; skipped where mounting is not allowed."""
    folder = tmp_path / "disk"
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr.strip()[:120]}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(disk: Path) -> None:
    """Use up the free space of ``disk`` (to the last block)."""
    with (disk / "filler").open("wb", buffering=0) as f:
        for chunk in (1 << 16, 512):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass


def test_a_full_disk_during_sync_is_a_clear_error_and_changes_nothing(small_disk, mcp_catalog, tiny_bert_dir,
                                                                       tmp_path, capsys):
    idx = small_disk / "idx"
    sync_index(mcp_catalog[0], idx, spec(tiny_bert_dir))
    (idx / "README.md").write_text("mine")
    before = tree(idx)
    fill(small_disk)
    catalog, _ = write_mcp_catalog(tmp_path / "v2", MCP_SERVERS + [RECIPES], [])
    assert cli(["index", "sync", str(catalog), "--index", str(idx)]) == 2
    err = capsys.readouterr().err
    assert "no space left" in err and str(idx) in err and "not changed" in err and "Traceback" not in err
    assert tree(idx) == before and len(load_index(idx).tools) == 10
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "idx"]


def test_a_full_disk_during_evaluate_is_a_clear_error(small_disk, tiny_dataset_dir, capsys):
    out = small_disk / "out"
    fill(small_disk)
    assert cli(["evaluate", "retriever.name=bm25", f"data.name={tiny_dataset_dir}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no space left" in err and str(out) in err and "re-run" in err and "Traceback" not in err
    assert not (out / "results.json").exists()
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name or ".new-" in p.name]


def test_toolgraph_retrieve_writes_nothing_into_the_working_folder(tmp_path, monkeypatch, tiny_bert_dir,
                                                                   tiny_dataset_dir, capsys):
    """A read stores no query vector (user text) in ./.cache, as the server does not (found on the
    real DRAFT G2 catalog: ``toolgraph retrieve`` left .cache/embeddings in the working folder)."""
    from toolgraph.cli import main
    from toolgraph.data import load_dataset
    from toolgraph.retrieval.dense import DenseConfig, DenseRetriever

    r = DenseRetriever(DenseConfig(model=str(tiny_bert_dir), cache_dir=None, progress=False))
    r.index(load_dataset(str(tiny_dataset_dir)).tools)
    r.save(tmp_path / "index")
    meta = json.loads((tmp_path / "index" / "retriever.json").read_text())
    assert meta["config"]["encoder"]["name"] == "encoder"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    index = tmp_path / "index"
    meta["config"]["encoder"]["cache_dir"] = ".cache/embeddings"  # the default of a dense retriever
    (index / "retriever.json").write_text(json.dumps(meta))
    (index / "manifest.json").unlink()
    assert main(["retrieve", "--checkpoint", str(index), "-k", "2", "weather in paris"]) == 0
    assert "get_weather" in capsys.readouterr().out
    assert list(work.iterdir()) == []


def test_a_canonical_catalogs_text_over_the_limit_is_refused_too(tmp_path):
    """A tools.jsonl catalog given to index sync gets the MCP catalog's bound on each text."""
    from toolgraph.sync import read_catalog_any

    folder = tmp_path / "catalog"
    folder.mkdir()
    rows = [{"id": "ok", "name": "ok", "description": "fine"}, {"id": "huge", "name": "huge", "description": "x" * 70_000}]
    (folder / "tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "queries.jsonl").write_text("")
    with pytest.raises(DataError, match=r"tool 'huge': 'description' is 70,000 characters, over the limit") as e:
        read_catalog_any(folder)
    assert "tools.jsonl" in str(e.value)
    assert len(read_catalog_any(folder, max_text_chars=100_000)[0]) == 2
