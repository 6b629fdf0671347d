import json
from pathlib import Path

import pytest

from toolgraph.data.sources.gorilla import (
    instruction,
    load_gorilla_huggingface,
    load_gorilla_tensorflow,
    load_gorilla_torchhub,
)
from toolgraph.errors import DataError

SLOW_R50 = "torch.hub.load(repo_or_dir='facebookresearch/pytorchvideo', model='slow_r50', pretrained=True)"
MERGED = "catalog row for a model already listed (merged into its first row)"


@pytest.mark.realdata
def test_gorilla_torchhub_real(data_root):
    ds = load_gorilla_torchhub(data_root)
    st = ds.stats()
    assert st["tools"] == 94 and st["agents"] == 26 and st["dependencies"] == 0
    assert st["queries"] == {"train": 753, "val": 84, "test": 186}
    assert st["skipped"] == {}
    q = {x.id: x for x in ds.queries}
    assert q["torchhub_eval:1"].text == "What is an API that can be used to classify sports activities in videos?"
    assert q["torchhub_eval:1"].tools == (SLOW_R50,)
    assert q["torchhub_train:1"].text == ("I need an API that can estimate the relative depth of objects from a single "
                                         "image. The output should be an inverse depth map.")
    tool = ds.tool_by_id()[SLOW_R50]
    assert (tool.name, tool.agent, tool.category) == ("slow_r50", "facebookresearch/pytorchvideo", "Video Classification")
    assert sum(t.agent == "pytorch/vision" for t in ds.tools) == 33
    assert [x.split for x in load_gorilla_torchhub(data_root, seed=1).queries] != [x.split for x in ds.queries]


@pytest.mark.realdata
def test_gorilla_huggingface_real(data_root):
    ds = load_gorilla_huggingface(data_root)
    st = ds.stats()
    assert st["tools"] == 910 and st["agents"] == 306
    assert st["queries"] == {"train": 0, "val": 0, "test": 911}
    assert st["skipped"] == {MERGED: 26}
    assert ds.notes["gold_matched_by_api_name_only"] == 1
    assert ds.notes["records_with_several_instructions_last_kept"] == 1
    q = {x.id: x for x in ds.queries}
    assert q["huggingface_eval:1"].tools == ("princeton-nlp/unsup-simcse-roberta-base",)
    assert q["huggingface_eval:1"].text.startswith("Design a feature for a social media website to recommend articles")
    assert q["huggingface_eval:494"].tools == ("ismail-lucifer011/autotr",)  # the catalog row's call is truncated
    assert q["huggingface_eval:888"].text.startswith("We are trying to summarize the following paragraph:")
    assert "###" not in q["huggingface_eval:888"].text
    tools = ds.tool_by_id()
    assert tools["microsoft/DialoGPT-large"].agent == "microsoft"  # api_name 'DialoGPT-large' rows merge here
    assert tools["bert-base-uncased"].agent is None
    assert sum(t.id.startswith("abhishek/autotrain-") for t in ds.tools) >= 2  # joblib.load is no identity


@pytest.mark.realdata
def test_gorilla_tensorflow_real(data_root):
    ds = load_gorilla_tensorflow(data_root)
    st = ds.stats()
    assert st["tools"] == 58 and st["agents"] == 3
    assert st["queries"] == {"train": 0, "val": 0, "test": 688}
    assert st["skipped"] == {MERGED: 638}
    q = {x.id: x for x in ds.queries}
    assert q["tensorflow_eval:1"].tools == ("google/imagenet/mobilenet_v2_100_224/feature_vector/4",)
    use = ds.tool_by_id()["google/universal-sentence-encoder/4"]
    assert use.agent == "google" and use.category == "Text embedding"
    assert use.description.startswith("The Universal Sentence Encoder encodes text into high-dimensional vectors")
    assert sum(x.tools == (use.id,) for x in ds.queries) > 100


def test_instruction_extraction():
    assert instruction("###Instruction: Find a model.\n###Output: <<<domain>>>: x") == "Find a model."
    assert instruction("### Instruction: Find it.\n### Output: y") == "Find it."
    assert instruction("###Instruction: Translate this.\n###Input: \"hi\"\n###Output: z") == "Translate this."
    assert instruction("###Instruction: Example.\n###Output: e\n\n###Instruction: Real request.\n###Output: r") == \
        "Real request."
    assert instruction("{'Instruction': Estimate depth, please., 'Input': 'x', 'Output': {'a': 1}}") == \
        "Estimate depth, please."
    assert instruction("no marker at all") is None


def _api(name: str, call: str, domain: str = "Classification", desc: str = "") -> dict:
    return {"domain": domain, "framework": "X", "functionality": "f", "api_name": name, "api_call": call,
            "api_arguments": "N/A", "python_environment_requirements": [], "example_code": "", "performance": {},
            "description": desc or f"{name} model"}


def _rec(instr: str, api: dict) -> dict:
    return {"code": f"###Instruction: {instr}\n###Output: <<<api_call>>>: {api['api_call']}",
            "api_call": api["api_call"], "provider": "X", "api_data": api}


def _write(root: Path, api_name: str, apis: list, files: dict[str, list]) -> Path:
    folder = root / "gorilla-apibench" / "data"
    (folder / "api").mkdir(parents=True)
    (folder / "apibench").mkdir()

    def lines(rows: list) -> str:
        return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)

    (folder / "api" / api_name).write_text(lines(apis))
    for fname, rows in files.items():
        (folder / "apibench" / fname).write_text(lines(rows))
    return root


def test_gorilla_tensorflow_merges_rows_by_handle(tmp_path):
    use = "https://tfhub.dev/google/universal-sentence-encoder/4"
    a = _api("universal-sentence-encoder", f"hub.load('{use}')", "Text embedding", "first text")
    b = _api("model_id", f"hub.load('{use}')", "Text embedding", "paraphrase")
    c = _api("mobilenet", "hub.KerasLayer('https://tfhub.dev/google/imagenet/mobilenet_v2/4')")
    d = _api("mobilenet_cls", "tf.keras.Sequential([hub.KerasLayer(\"https://tfhub.dev/google/imagenet/mobilenet_v2/4\")])")
    ghost = _api("ghost", "hub.load('https://tfhub.dev/google/ghost/1')")
    ds = load_gorilla_tensorflow(_write(tmp_path, "tensorflowhub_api.jsonl", [a, b, c, d], {
        "tensorflow_eval.json": [_rec("Embed text.", b), _rec("Classify images.", d), _rec("Embed text.", a),
                                 _rec("Unknown.", ghost), {"code": "nothing", "api_data": a}]}))
    assert [t.id for t in ds.tools] == ["google/universal-sentence-encoder/4", "google/imagenet/mobilenet_v2/4"]
    assert ds.tools[0].description == "first text" and ds.tools[0].parameters is None
    assert [a.id for a in ds.agents] == ["google"]
    assert [(q.id, q.text, q.tools, q.split) for q in ds.queries] == [
        ("tensorflow_eval:1", "Embed text.", ("google/universal-sentence-encoder/4",), "test"),
        ("tensorflow_eval:2", "Classify images.", ("google/imagenet/mobilenet_v2/4",), "test")]
    assert ds.skipped == {MERGED: 2, "repeated instruction text (first kept, test file read first)": 1,
                          "record whose api_data names no catalog model": 1,
                          "record without an instruction in 'code'": 1}


def test_gorilla_huggingface_keys_by_model_repo(tmp_path):
    a = _api("owner1/tabular-a", "joblib.load('model.joblib')")
    b = _api("owner2/tabular-b", "joblib.load('model.joblib')")
    c = _api("DialoGPT-large", "AutoModelForCausalLM.from_pretrained('microsoft/DialoGPT-large')")
    d = _api("microsoft/DialoGPT-large", "pipeline('conversational')")
    e = _api("bert-base-uncased", "pipeline('fill-mask', model='bert-base-uncased')")
    call_variant = {**e, "api_call": "pipeline('fill-mask', model='bert-base-uncased', top_k=3)"}
    ds = load_gorilla_huggingface(_write(tmp_path, "huggingface_api.jsonl", [a, b, c, d, e], {
        "huggingface_eval.json": [_rec("Predict income.", b), _rec("Chat.", d), _rec("Fill the mask.", call_variant)]}))
    assert [t.id for t in ds.tools] == ["owner1/tabular-a", "owner2/tabular-b", "microsoft/DialoGPT-large",
                                        "bert-base-uncased"]
    assert [t.agent for t in ds.tools] == ["owner1", "owner2", "microsoft", None]
    assert [q.tools for q in ds.queries] == [("owner2/tabular-b",), ("microsoft/DialoGPT-large",),
                                             ("bert-base-uncased",)]
    assert ds.skipped == {MERGED: 1}


def test_gorilla_torchhub_train_val_test(tmp_path):
    apis = [_api(f"m{i}", f"torch.hub.load(repo_or_dir='org/repo:hub', model='m{i}', pretrained=True)")
            for i in range(3)]
    train = [{"code": f"{{'Instruction': Task number {i}., 'Output': {{'domain': 'x'}}}}",
              "api_call": apis[i % 3]["api_call"], "provider": "PyTorch", "api_data": apis[i % 3]} for i in range(20)]
    root = _write(tmp_path, "torchhub_api.jsonl", apis,
                  {"torchhub_train.json": train, "torchhub_eval.json": [_rec("Test task.", apis[0])]})
    ds = load_gorilla_torchhub(root, val_fraction=0.25)
    assert ds.stats()["queries"] == {"train": 15, "val": 5, "test": 1}
    assert [a.id for a in ds.agents] == ["org/repo"]
    q = {x.id: x for x in ds.queries}
    assert q["torchhub_train:2"].text == "Task number 1." and q["torchhub_train:2"].tools == (apis[1]["api_call"],)


def test_gorilla_malformed_json_names_file_and_line(tmp_path):
    api = _api("m", "torch.hub.load('org/repo', 'm')")
    root = _write(tmp_path, "torchhub_api.jsonl", [api],
                  {"torchhub_eval.json": [_rec("ok", api), "{broken"], "torchhub_train.json": []})
    with pytest.raises(DataError, match=r"torchhub_eval\.json:2: malformed JSON"):
        load_gorilla_torchhub(root)


def test_gorilla_missing_fields(tmp_path):
    api = _api("m", "torch.hub.load('org/repo', 'm')")
    root = _write(tmp_path, "torchhub_api.jsonl", [api, {"api_name": "x", "description": "d"}],
                  {"torchhub_eval.json": [], "torchhub_train.json": []})
    with pytest.raises(DataError, match=r"torchhub_api\.jsonl:2: missing field 'api_call'"):
        load_gorilla_torchhub(root)
    root = _write(tmp_path / "b", "torchhub_api.jsonl", [api],
                  {"torchhub_eval.json": [{"code": "###Instruction: x", "api_data": {"api_name": "m"}}],
                   "torchhub_train.json": []})
    with pytest.raises(DataError, match=r"torchhub_eval\.json:1: api_data: missing field 'api_call'"):
        load_gorilla_torchhub(root)
