import json
from collections import Counter
from pathlib import Path

import pytest

from toolgraph.data.sources.toolbank import load_toolbank_aws, load_toolbank_numpy, load_toolbank_pandas
from toolgraph.errors import DataError

BANK = Path("toolbank-tool2vec") / "toolrag" / "data_generation"


@pytest.mark.realdata
def test_toolbank_real(data_root):
    numpy, pandas, aws = load_toolbank_numpy(data_root), load_toolbank_pandas(data_root), load_toolbank_aws(data_root)
    for ds, tools, agents in ((numpy, 527, 6), (pandas, 1655, 45), (aws, 1002, 4)):
        st = ds.stats()
        assert (st["tools"], st["agents"], st["dependencies"], st["skipped"]) == (tools, agents, 0, {})
        assert st["queries"] == {"train": 0, "val": 0, "test": 0}
    t = numpy.tool_by_id()["numpy.absolute"]
    assert (t.name, t.agent) == ("elemental_magnitude", "numpy")
    assert t.description.startswith("Compute the non-negative magnitude of each element in the input array.")
    assert numpy.tool_by_id()["numpy.linalg.cross"].agent == "numpy.linalg"
    assert sum(x.name == "vector_product" for x in numpy.tools) == 3  # ToolBank reuses some renamed names
    assert Counter(x.agent for x in aws.tools) == {"ec2": 626, "rds": 167, "iam": 163, "sns": 46}
    t = aws.tool_by_id()["ec2.client.accept_address_transfer"]
    assert t.name == "ec2.client.accept_address_transfer" and t.description.startswith("Accepts an Elastic IP")
    t = pandas.tool_by_id()["pandas.tseries.offsets.FY5253.get_year_end"]
    assert (t.name, t.agent) == ("compute_fiscal_year_closure", "tseries")
    assert t.parameters == {"dt": "datetime-like - The date for which to calculate the fiscal year end."}
    assert t.returns == "datetime - The closing date of the fiscal year for the provided date."
    assert pandas.tool_by_id()["pandas.tseries.offsets.CustomBusinessHour.copy"].returns.startswith("CustomBusinessHour")
    assert pandas.tool_by_id()["pandas.crosstab"].agent == "main"


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / BANK / rel
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return root


def test_toolbank_fixture_fields_owners_and_repeats(tmp_path):
    text = ('{"numpy.add": {"new_func": "summation", "description": "Add arrays."},\n'
            ' "numpy.linalg.norm": {"new_func": "magnitude", "description": "Vector norm."},\n'
            ' "numpy.sub": {"new_func": "difference", "description": "   "},\n'
            ' "numpy.add": {"new_func": "again", "description": "Repeated key."}}')
    ds = load_toolbank_numpy(_write(tmp_path, "bank_numpy/numpy_function_descriptions.json", text))
    assert [(t.id, t.name, t.agent, t.description) for t in ds.tools] == [
        ("numpy.add", "summation", "numpy", "Add arrays."), ("numpy.linalg.norm", "magnitude", "numpy.linalg", "Vector norm.")]
    assert ds.skipped == {"key repeated inside a JSON object (first value kept)": 1,
                          "function with an empty description": 1}
    assert ds.queries == []


def test_toolbank_pandas_class_is_agent(tmp_path):
    rows = {"pandas.Series.abs": {"new_func": "AbsVal", "description": "Absolute values.", "class": "Series"},
            "pandas.cut": {"new_func": "Binner", "description": "Bin values.", "class": "main",
                           "parameters": {"x": "array"}, "returns": "Categorical"}}
    root = _write(tmp_path, "bank_pandas/pandas_function_descriptions_with_classes.json", json.dumps(rows))
    ds = load_toolbank_pandas(root)
    assert [(t.agent, t.parameters, t.returns) for t in ds.tools] == [("Series", None, None),
                                                                     ("main", {"x": "array"}, "Categorical")]
    assert sorted(a.id for a in ds.agents) == ["Series", "main"]


def test_toolbank_malformed_json_names_file_and_line(tmp_path):
    root = _write(tmp_path, "bank_aws/aws_function_descriptions.json",
                  '{\n "ec2.client.a": {"new_func": "ec2.client.a", "description": "x"},\n oops\n}')
    with pytest.raises(DataError, match=r"aws_function_descriptions\.json:3: malformed JSON"):
        load_toolbank_aws(root)


def test_toolbank_missing_field(tmp_path):
    root = _write(tmp_path, "bank_aws/aws_function_descriptions.json",
                  json.dumps({"ec2.client.a": {"new_func": "ec2.client.a"}}))
    with pytest.raises(DataError, match=r"aws_function_descriptions\.json: function 'ec2.client.a': missing field "
                                        r"'description'"):
        load_toolbank_aws(root)
    root = _write(tmp_path / "b", "bank_aws/aws_function_descriptions.json", json.dumps([{"new_func": "x"}]))
    with pytest.raises(DataError, match="expected a JSON object"):
        load_toolbank_aws(root)
