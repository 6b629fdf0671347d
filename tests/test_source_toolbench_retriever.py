import csv
import json
from pathlib import Path

import pytest

from toolgraph.data.sources.toolbench_retriever import load_toolbench_retriever
from toolgraph.errors import DataError


@pytest.mark.realdata
def test_toolbench_retriever_demo(data_root):
    ds = load_toolbench_retriever(data_root)
    st = ds.stats()
    assert (st["tools"], st["agents"], st["dependencies"]) == (5, 2, 0)
    assert st["queries"] == {"train": 1, "val": 0, "test": 2}
    assert st["skipped"] == {"repeated corpus line (same docid, same document)": 2,
                             "repeated query line (one per relevant API)": 4}
    q = {x.id: x for x in ds.queries}
    assert q["1"].split == "train" and q["1"].text.startswith("Can you help me research the NFTs")
    # qrels order (docid 2 then 1), not the corpus order
    assert q["1"].tools == ("NFTs by address::getNFTs_metadata", "NFTs by address::getNFTs_byaddress")
    assert q["3"].tools == ("Olato Quotes::Motivation Quote", "Olato Quotes::Love Quote", "Olato Quotes::Success Quote")
    t = ds.tool_by_id()["NFTs by address::getNFTs_byaddress"]
    assert t.description.startswith("Gets all NFTs currently owned by a given address.")
    assert (t.agent, t.category) == ("NFTs by address", "Finance")
    assert t.parameters["required"][0]["name"] == "owner" and t.parameters["optional"][0]["name"] == "pageKey"


def _doc(tool: str, api: str, desc: str = "does it") -> str:
    return json.dumps({"category_name": "Data", "tool_name": tool, "api_name": api, "api_description": desc,
                       "required_parameters": [], "optional_parameters": [], "method": "GET", "template_response": {}})


def _write(folder: Path, corpus: list, queries: dict[str, list], qrels: dict[str, list[str]]) -> Path:
    """pandas-style files: csv's default (minimal) quoting is what DataFrame.to_csv(sep='\\t') writes."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.tsv").open("w", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["docid", "document_content"])
        w.writerows(corpus)
    for split in ("train", "test"):
        with (folder / f"{split}.query.txt").open("w", newline="") as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows(queries.get(split, []))
        (folder / f"qrels.{split}.tsv").write_text(qrels.get(split, ""))
    return folder


def test_toolbench_retriever_parse_and_skips(tmp_path):
    corpus = [["1", _doc("W", "now", 'say "hi"\tthere')], ["2", _doc("W", "week")], ["2", _doc("W", "week")],
              ["3", _doc("W", "now", "other doc")]]
    text = 'what is "the weather"\tnow\nand later'  # quoted field with tab and newline
    queries = {"train": [[str(i), f"query {i}"] for i in range(10, 30)] + [["5", text], ["5", text], ["6", "no qrels"]],
               "test": [["7", "week please"], ["8", "ghost"]]}
    train = "".join(f"{i}\t0\t1\t1\n" for i in range(10, 30)) + "5\t0\t3\t1\n5\t0\t1\t1\n5\t0\t2\t0\n"
    qrels = {"train": train, "test": "7\t0\t2\t1\n7\t0\t2\t1\n8\t0\t99\t1\n"}
    ds = load_toolbench_retriever(tmp_path, path=str(_write(tmp_path / "G9", corpus, queries, qrels)), val_fraction=0.2)
    assert [t.id for t in ds.tools] == ["W::now", "W::week", "W::now~2"]
    assert ds.tool_by_id()["W::now"].description == 'say "hi"\tthere'
    q = {x.id: x for x in ds.queries}
    assert q["5"].text == text and q["5"].tools == ("W::now~2", "W::now")  # relevance 0 ignored
    assert q["7"].tools == ("W::week",) and q["7"].split == "test"
    assert ds.stats()["queries"] == {"train": 17, "val": 4, "test": 1}
    assert ds.skipped == {"repeated corpus line (same docid, same document)": 1,
                          "repeated query line (one per relevant API)": 1, "query without qrels": 1,
                          "repeated relevant API within a query": 1, "qrels pair naming a docid not in corpus.tsv": 1,
                          "query with no relevant doc in corpus.tsv": 1}


def test_toolbench_retriever_malformed_doc(tmp_path):
    folder = _write(tmp_path / "G", [["1", _doc("W", "now")], ["2", '{"tool_name": "W",']], {}, {})
    with pytest.raises(DataError, match=r"corpus\.tsv:3: docid '2': malformed JSON"):
        load_toolbench_retriever(tmp_path, path=str(folder))


def test_toolbench_retriever_missing_field(tmp_path):
    doc = json.loads(_doc("W", "now"))
    del doc["api_name"]
    folder = _write(tmp_path / "G", [["1", json.dumps(doc)]], {}, {})
    with pytest.raises(DataError, match=r"corpus\.tsv:2: docid '1': missing or empty 'api_name'"):
        load_toolbench_retriever(tmp_path, path=str(folder))


def test_toolbench_retriever_bad_qrels_and_queries(tmp_path):
    corpus = [["1", _doc("W", "now")]]
    folder = _write(tmp_path / "A", corpus, {"train": [["1", "q"]]}, {"train": "1\t0\t1\n"})
    with pytest.raises(DataError, match=r"qrels\.train\.tsv:1: expected 4"):
        load_toolbench_retriever(tmp_path, path=str(folder))
    folder = _write(tmp_path / "B", corpus, {"train": [["1", "q"]]}, {"train": "1\t0\t1\t1\n2\t0\t1\t1\n"})
    with pytest.raises(DataError, match="query '2' that train.query.txt lacks"):
        load_toolbench_retriever(tmp_path, path=str(folder))
    folder = _write(tmp_path / "C", corpus, {"train": [["1", "q"], ["1", "other"]]}, {"train": "1\t0\t1\t1\n"})
    with pytest.raises(DataError, match=r"train\.query\.txt:2: query '1' repeated with different text"):
        load_toolbench_retriever(tmp_path, path=str(folder))
    folder = _write(tmp_path / "D", corpus + [["1", _doc("W", "later")]], {}, {})
    with pytest.raises(DataError, match=r"corpus\.tsv:3: docid '1' repeated with different content"):
        load_toolbench_retriever(tmp_path, path=str(folder))
