import json
from pathlib import Path

import pytest

from toolgraph.data.sources.api_bank import load_api_bank
from toolgraph.data.sources.api_bank_parse import parse_call, py_literal, split_request, turns, user_text
from toolgraph.errors import ConfigError, DataError

REAL_SKIPPED = {
    "ToolSearcher call (retrieval meta-tool, not a gold tool)": 621,
    "all_apis.csv row with unparsable api_info": 1,
    "dialogue calling an API with no spec in the catalog": 2,
    "dialogue whose only calls are ToolSearcher": 9,
    "duplicate dialogue (same user text and gold APIs as an earlier one)": 4,
    "repeated call of an API already in the dialogue's gold list": 64,
    "unparsable ToolSearcher result (its spec not harvested)": 2,
}


@pytest.mark.realdata
def test_api_bank_real(data_root):
    ds = load_api_bank(data_root)
    st = ds.stats()
    assert st["tools"] == 501 and st["agents"] == 0
    assert st["queries"] == {"train": 292, "val": 32, "test": 311}
    assert st["dependencies"] == 66
    assert st["skipped"] == REAL_SKIPPED
    assert ds.notes["names_with_conflicting_specs"] == 93
    assert ds.notes["spec_origin"] == {"level-1 prompt": 49, "level-3 ToolSearcher": 18,
                                       "lv3 train ToolSearcher": 382, "all_apis.csv": 52}
    per_level = {p: sum(q.id.startswith(p + "-") for q in ds.queries) for p in ("l1", "l2", "l3", "lv3")}
    assert per_level == {"l1": 212, "l2": 49, "l3": 50, "lv3": 324}

    q = {x.id: x for x in ds.queries}
    multi = q["l1-ModifyRegistration-QueryHealthData-CancelRegistration-level-2-2"]
    assert multi.tools == ("ModifyRegistration", "QueryHealthData", "CancelRegistration")
    assert multi.text.startswith("Can you please modify my appointment scheduled for March 25th")
    assert multi.text.count("\n") == 5  # six User turns, no AI turns, no prompt
    assert q["l1-DeleteAccount-ModifyPassword-GetUserToken-level-2-1"].tools == ("GetUserToken", "DeleteAccount")
    assert q["l2-QueryHistoryToday-level-3-3"].tools == ("QueryHistoryToday",)  # ToolSearcher step left out
    assert q["l3-0"].text == "Query meeting of John and send email reminder to john@example.com."
    assert q["l3-0"].tools == ("QueryMeeting", "EmailReminder")
    lv3 = q["lv3-0"]
    assert lv3.text == "Find a cardiologist in Los Angeles for a check-up appointment."  # TIME stamp removed
    assert lv3.tools == ("HealthcareProviderAppointmentChecker", "HealthcareProviderAppointmentScheduler")
    assert not any("API descriptions" in x.text or "apiCode" in x.text or "User:" in x.text for x in ds.queries)

    tools = ds.tool_by_id()
    assert "ToolSearcher" not in tools
    assert tools["GetUserToken"].description == "Get the user token by username and password."
    assert set(tools["GetUserToken"].returns) == {"token"}
    assert "token" in tools["ModifyPassword"].parameters  # the test spec wins over all_apis.csv's
    assert tools["Transfer"].description.startswith("API to transfer money between accounts.")  # csv only
    assert tools["Transfer"].category is None

    edges = {(d.source, d.target, d.kind) for d in ds.dependencies}
    assert sum(d.kind == "token" for d in ds.dependencies) == 24
    assert ("DeleteAccount", "GetUserToken", "token") in edges  # value flow in level-1
    assert ("Transfer", "GetUserToken", "token") in edges  # the token rule (no dialogue calls Transfer)
    assert ("TaxCalculator", "GetOccupationSalary", "data") in edges  # lv3 training: salary
    assert ("GetWeatherForCoordinates", "Geocoding", "data") in edges  # level 3: latitude, longitude
    assert ds.notes["dependency_params"]["GetWeatherForCoordinates->Geocoding"] == ["latitude", "longitude"]


@pytest.mark.realdata
def test_api_bank_real_options(data_root):
    lv1 = load_api_bank(data_root, levels=[1])
    assert lv1.stats()["queries"]["test"] == 212 and len(lv1.tools) == 501
    assert lv1.skipped["level-2 test dialogue left out by option levels"] == 49
    assert lv1.skipped["level-3 test dialogue left out by option levels"] == 50
    assert len(load_api_bank(data_root, dependency_splits=["train"]).dependencies) == 60
    from_test = load_api_bank(data_root, val_from="test", val_fraction=0.3, dependency_splits=["train"])
    counts = from_test.stats()["queries"]
    assert (counts["train"], counts["val"], counts["test"]) == (324, 93, 218)  # lv3 all train; 311 test -> 93 + 218
    assert sum("GetUserToken" in q.tools for q in from_test.split("val")) > 20  # what the lv3 val never has
    assert len(from_test.dependencies) == 62  # the 32 former val dialogues are train now: 2 more chains
    cat = load_api_bank(data_root, csv_category=True).tool_by_id()
    assert cat["Transfer"].category == "财务管理" and cat["GetUserToken"].category == "账户管理"


# ---- tiny fake root in the source's own formats --------------------------------------------------
TOKEN = {"name": "GetUserToken", "description": "Get the user token.",
         "input_parameters": {"username": {"type": "str"}}, "output_parameters": {"token": {"type": "str"}}}
DELETE = {"name": "DeleteAccount", "description": "Delete an account.",
          "input_parameters": {"token": {"type": "str"}}, "output_parameters": {"status": {"type": "str"}}}
SEARCHER = {"name": "ToolSearcher", "description": "Searches for relevant tools.",
            "input_parameters": {"keywords": {"type": "str"}}, "output_parameters": {"best_matchs": {}}}
CSV_HEADER = "id,类型,应用场景,API名称,参数,路径,类名,input_parameters,expressions,api_info\n"
CSV_ROW = ('1,t,账户管理,n,p,x.py,QueryBankAccount,(token: str),e,"description = ""Query an account.""\n'
           "input_parameters = {'token': {'type': 'str'}}\noutput_parameters = {'info': {'type': 'str'}}\"\n")


def _l1(file: str, id_: int, dialogue: str, call: str, specs=(TOKEN, DELETE)) -> dict:
    instruction = "\nGenerate an API request.\nAPI descriptions:\n" + "\n".join(json.dumps(s) for s in specs) + "\n"
    return {"file": file, "id": id_, "instruction": instruction, "input": dialogue + "Generate API Request:\n",
            "expected_output": f"API-Request: [{call}]"}


def _lv3(dialogue: str, call: str) -> dict:
    spec = '{"apiCode": "ToolSearcher", "description": "Searches for relevant tools."}\n'
    return {"instruction": "x", "input": spec + dialogue + "Generate API Request: ", "output": f"API-Request: [{call}]"}


TOKEN_CALL = "API-Request: [GetUserToken(username='u')]->{'token': 'tk123'}\n"
FOUND = ("API-Request: [ToolSearcher(keywords='x')]->{'name': 'Salary', 'description': 'The user's salary.', "
         "'input_parameters': {'job': {'type': str}}, 'output_parameters': {'salary': {'type': 'int'}}}\n")
FOUND_TAX = ("API-Request: [ToolSearcher(keywords='tax')]->{'name': 'Tax', 'description': 'Tax on a salary.', "
             "'input_parameters': {'salary': {'type': 'int'}}, 'output_parameters': {'tax': {}}}\n")


def _write(root: Path, level1=None, level2=None, level3=None, train=None, csv_text=None) -> Path:
    folder = root / "api-bank" / "api-bank"
    for sub in ("test-data", "training-data", "data"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    user = "User: Delete my account, I am u.\nAI: Sure.\n"
    level1 = level1 if level1 is not None else [
        _l1("a.jsonl", 0, user, "GetUserToken(username='u')"),
        _l1("a.jsonl", 2, user + TOKEN_CALL, "DeleteAccount(token='tk123')"),
        _l1("b.jsonl", 0, "AI: Hello.\n", "GetUserToken(username='v')"),
    ]
    level2 = level2 if level2 is not None else [
        _l1("c.jsonl", 0, "User: Remove my account.\n", "ToolSearcher(keywords='delete')", specs=(SEARCHER,)),
        _l1("c.jsonl", 1, "User: Remove my account.\nAPI-Request: [ToolSearcher(keywords='delete')]->"
            + repr(DELETE) + "\n" + TOKEN_CALL, "DeleteAccount(token='tk123')", specs=(SEARCHER,)),
    ]
    level3 = level3 if level3 is not None else [{"requirement": " Get a token. ", "apis": [
        {"api_name": "GetUserToken", "input": {"username": "w"}, "output": {"output": {"token": "t9"}}}]}]
    salary = "User: What is my tax?TIME: 2034-01-01 08:00:00\n"
    train = train if train is not None else [
        _lv3(salary, "ToolSearcher(keywords='x')"),
        _lv3(salary + FOUND, "Salary(job='cook')"),
        _lv3(salary + FOUND + "API-Request: [Salary(job='cook')]->{'salary': 5000}\n", "ToolSearcher(keywords='tax')"),
        _lv3(salary + FOUND + "API-Request: [Salary(job='cook')]->{'salary': 5000}\n" + FOUND_TAX, "Tax(salary=5000)"),
        _lv3(salary, "ToolSearcher(keywords='x')"),  # the same request again: a new dialogue
        _lv3(salary + FOUND, "Salary(job='cook')"),
        _lv3("User: Unknown thing.\n", "Nowhere(x=1)"),
    ]
    files = {"test-data/level-1-api.json": level1, "test-data/level-2-api.json": level2,
             "test-data/level-3.json": level3, "training-data/lv3-api-train.json": train,
             "training-data/lv3-response-train.json": []}
    for rel, rows in files.items():
        (folder / rel).write_text(rows if isinstance(rows, str) else json.dumps(rows, indent=1))
    (folder / "data" / "all_apis.csv").write_text(csv_text if csv_text is not None else CSV_HEADER + CSV_ROW)
    return folder


def test_api_bank_fixture_grouping_labels_and_dependencies(tmp_path):
    _write(tmp_path)
    ds = load_api_bank(tmp_path, val_fraction=0.0)
    assert sorted(t.id for t in ds.tools) == ["DeleteAccount", "GetUserToken", "QueryBankAccount", "Salary", "Tax"]
    q = {x.id: x for x in ds.queries}
    assert set(q) == {"l1-a", "l2-c", "l3-0", "lv3-0", "lv3-4"}  # lv3-4: same request again, new dialogue
    assert q["l1-a"].tools == ("GetUserToken", "DeleteAccount") and q["l1-a"].text == "Delete my account, I am u."
    assert q["l2-c"].tools == ("DeleteAccount",)
    assert q["l3-0"].text == "Get a token." and q["l3-0"].split == "test"
    assert q["lv3-0"].tools == ("Salary", "Tax") and q["lv3-0"].text == "What is my tax?"
    assert q["lv3-4"].tools == ("Salary",)
    assert ds.tool_by_id()["Salary"].description == "The user's salary."  # lenient Python literal
    assert ds.skipped["dialogue calling an API with no spec in the catalog"] == 1  # Nowhere
    assert ds.skipped["dialogue with no User utterance"] == 1
    assert ds.skipped["ToolSearcher call (retrieval meta-tool, not a gold tool)"] == 4
    edges = {(d.source, d.target, d.kind) for d in ds.dependencies}
    assert edges == {("DeleteAccount", "GetUserToken", "token"), ("Tax", "Salary", "data"),
                     ("QueryBankAccount", "GetUserToken", "token")}
    # without test evidence the token rule still links DeleteAccount; Tax<-Salary comes from train
    train_only = load_api_bank(tmp_path, val_fraction=0.0, dependency_splits=["train"])
    assert {(d.source, d.target) for d in train_only.dependencies} == {(s, t) for s, t, _ in edges}
    assert load_api_bank(tmp_path, levels=[3], val_fraction=0.0).skipped[
        "level-1 test dialogue left out by option levels"] == 2


def test_api_bank_repeated_dialogue_is_a_duplicate(tmp_path):
    salary = "User: What is my tax?\n"
    chain = [_lv3(salary, "ToolSearcher(keywords='x')"), _lv3(salary + FOUND, "Salary(job='cook')")]
    other = [_lv3(salary, "ToolSearcher(keywords='x')"), _lv3(salary + FOUND, "Salary(job='chef')"),
             _lv3(salary + FOUND + "API-Request: [Salary(job='chef')]->{'salary': 1}\n", "Salary(job='cook')")]
    _write(tmp_path, train=chain + chain + other)
    ds = load_api_bank(tmp_path, val_fraction=0.0)
    # records 2-3 repeat records 0-1 exactly; records 4-6 ask the same but call Salary twice (gold Salary once)
    assert ds.skipped["duplicate dialogue (same user text and gold APIs as an earlier one)"] == 2
    assert ds.skipped["repeated call of an API already in the dialogue's gold list"] == 0
    assert [x.id for x in ds.queries if x.split == "train"] == ["lv3-0"]


def test_api_bank_malformed_json_names_file_and_line(tmp_path):
    _write(tmp_path, level1='[\n {"file": "a.jsonl",\n  oops\n]')
    with pytest.raises(DataError, match=r"level-1-api\.json:3: malformed JSON"):
        load_api_bank(tmp_path)


def test_api_bank_missing_field_names_record_and_field(tmp_path):
    rec = _l1("a.jsonl", 0, "User: hi\n", "GetUserToken(username='u')")
    del rec["expected_output"]
    _write(tmp_path, level1=[_l1("z.jsonl", 0, "User: x\n", "GetUserToken(username='u')"), rec])
    with pytest.raises(DataError, match=r"level-1-api\.json: record 1: missing field 'expected_output'"):
        load_api_bank(tmp_path)
    _write(tmp_path, level3=[{"requirement": "x", "apis": [{"api_name": "A", "input": {}}]}])
    with pytest.raises(DataError, match=r"record 0 api 0: missing field 'output'"):
        load_api_bank(tmp_path)


def test_api_bank_bad_description_line_and_csv(tmp_path):
    bad = _l1("a.jsonl", 0, "User: hi\n", "GetUserToken(username='u')")
    bad["instruction"] += "{not json\n"
    _write(tmp_path, level1=[bad])
    with pytest.raises(DataError, match=r"record 0: API description line 3 is not JSON"):
        load_api_bank(tmp_path)
    _write(tmp_path, level1=[], csv_text="id,类名\n1,X\n")
    with pytest.raises(DataError, match=r"all_apis\.csv:1: missing column\(s\) \['应用场景', 'api_info'\]"):
        load_api_bank(tmp_path)
    _write(tmp_path, level1=[], csv_text=CSV_HEADER + '2,t,s,n,p,x.py,Broken,(),e,"."\n')
    assert load_api_bank(tmp_path).skipped["all_apis.csv row with unparsable api_info"] == 1


def test_api_bank_bad_option(tmp_path):
    _write(tmp_path)
    with pytest.raises(ConfigError, match="levels"):
        load_api_bank(tmp_path, levels=[4])
    with pytest.raises(ConfigError, match=r"api-bank: option val_from='dev'; expected 'train' or 'test'"):
        load_api_bank(tmp_path, val_from="dev")


def test_api_bank_text_parsers():
    assert py_literal("{'d': 'the user's id', 'type': str, 'x': {1, 2}}") == {"d": "the user's id", "type": "str",
                                                                              "x": [1, 2]}
    with pytest.raises(ValueError):
        py_literal("{'type...truncated")
    assert parse_call(" PharmacyLocator(location=New York)") == ("PharmacyLocator", {})
    assert parse_call("[Calc(a=500, b='x')]") == ("Calc", {"a": "500", "b": "x"})
    # not Python (nested quotes): the quoted pairs are still read
    assert parse_call("[AddMeeting(token='t1', attendees='['J', 'K']')]")[1]["token"] == "t1"
    assert parse_call("no call here") is None
    assert split_request("[A(x='1')]->{'y': 2}") == ("[A(x='1')]", "{'y': 2}")
    assert turns('{"apiCode": "X"}\nUser: hi\nmore\nAI: ok\nGenerate API Request:\n') == [
        ("User", "hi\nmore"), ("AI", "ok"), ("Generate", "")]
    assert user_text("Book it.TIME: 2034-04-15 10:00:00") == "Book it."
