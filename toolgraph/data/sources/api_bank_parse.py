"""Text parsers for API-Bank (Li et al., EMNLP 2023): dialogue turns, ``API-Request`` calls, the
Python-literal API specs that ToolSearcher returns, and the spec block of ``all_apis.csv``.

API-Bank writes tool results with Python ``repr``-like text, not JSON, and the lv3 training data was
LLM-generated, so ~100 of its specs are not valid Python either: an unescaped apostrophe inside a
single-quoted string (``'the patient's condition'``) or a bare type name (``'type': str``). The
lenient reader below accepts exactly those two defects: bare names become their string, and an
apostrophe between two word characters is escaped before a second try. Anything else fails.
"""

from __future__ import annotations

import ast
import re
from typing import Any

_APOSTROPHE = re.compile(r"(?<=\w)'(?=\w)")
# One call: ``[Name(args)]`` as API-Bank prints it; two lv3 training outputs drop the brackets.
_CALL = re.compile(r"^\[?\s*([A-Za-z_]\w*)\s*\((.*)\)\s*\]?$", re.S)
_RESULT_SEP = re.compile(r"\)\]->")
_KWARG = re.compile(r"(?:^|,)\s*(\w+)\s*=\s*(?:'([^']*)'|\"([^\"]*)\")")
_ROLES = ("User: ", "AI: ", "API-Request: ", "Generate ")  # "Generate API Request:" / "Generate AI Response:"
_TIME_SUFFIX = re.compile(r"\s*TIME:\s*\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\s*$")


def _to_json(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("dict unpacking")
        return {_to_json(k): _to_json(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):  # sets -> lists so parameters stay JSON-able
        return [_to_json(e) for e in node.elts]
    if isinstance(node, ast.Name):  # ``'type': str`` -> "str"
        return node.id
    if isinstance(node, (ast.Subscript, ast.Attribute)):  # ``List[str]`` -> "List[str]"
        return ast.unparse(node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    raise ValueError(f"not a literal: {type(node).__name__}")


def _parse_expr(text: str) -> ast.expr:
    """Parse one Python expression, retrying once with intra-word apostrophes escaped."""
    try:
        return ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError):
        pass
    except (RecursionError, MemoryError):  # nested deeper than the parser goes
        raise ValueError("Python literal nested too deeply") from None
    try:
        return ast.parse(_APOSTROPHE.sub(r"\\'", text.strip()), mode="eval").body
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"unparsable Python literal: {getattr(e, 'msg', e)}") from None
    except (RecursionError, MemoryError):
        raise ValueError("Python literal nested too deeply") from None


def py_literal(text: str) -> Any:
    """Lenient ``ast.literal_eval`` returning JSON-able values; ValueError when it cannot."""
    try:
        return _to_json(_parse_expr(text))
    except RecursionError:
        raise ValueError("Python literal nested too deeply") from None


def parse_call(text: str) -> tuple[str, dict[str, str]] | None:
    """``[Name(k='v', ...)]`` -> (Name, {k: value as text}); None without a recognisable API name.

    Argument values are only needed as text (to see whether an earlier result holds them). When the
    argument list is not Python (``attendees='['John', 'Jane']'`` in level 1), the quoted
    ``key='value'`` pairs are read with a regular expression instead."""
    m = _CALL.match(text.strip())
    if not m:
        return None
    name, args = m.groups()
    try:
        call = _parse_expr(f"f({args})")
    except ValueError:
        call = None
    if not isinstance(call, ast.Call):
        return name, {m[1]: m[2] if m[3] is None else m[3] for m in _KWARG.finditer(args)}
    out: dict[str, str] = {}
    for kw in call.keywords:
        if kw.arg is not None:
            v = kw.value
            out[kw.arg] = str(v.value) if isinstance(v, ast.Constant) else ast.unparse(v)
    return name, out


def split_request(line: str) -> tuple[str, str | None]:
    """``[Name(args)]->result`` -> (call text, result text); (text, None) without a result."""
    m = _RESULT_SEP.search(line)
    if not m:
        return line, None
    return line[:m.start() + 2], line[m.end():]


def turns(text: str) -> list[tuple[str, str]]:
    """Dialogue text -> [(role, text)] with role in User, AI, API-Request, Generate.

    Lines before the first turn (the prompt's API descriptions) are dropped; a line starting with no
    role continues the previous turn."""
    out: list[tuple[str, str]] = []
    for line in text.split("\n"):
        role = next((r for r in _ROLES if line.startswith(r)), None)
        if role == "Generate ":
            out.append(("Generate", ""))
        elif role is not None:
            out.append((role.rstrip(": "), line[len(role):]))
        elif out and line.strip():
            out[-1] = (out[-1][0], out[-1][1] + "\n" + line)
    return out


def user_text(utterance: str) -> str:
    """A User turn without the ``TIME: <datetime>`` stamp the lv3 prompts append to it."""
    return _TIME_SUFFIX.sub("", utterance).strip()


def csv_api_info(text: str) -> dict[str, Any]:
    """The ``api_info`` cell of all_apis.csv (``description = ...`` / ``input_parameters = {...}`` /
    ``output_parameters = {...}`` assignments) -> dict; ValueError when it is not that."""
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"api_info is not Python: {getattr(e, 'msg', e)}") from None
    except (RecursionError, MemoryError):
        raise ValueError("api_info nested too deeply") from None
    out: dict[str, Any] = {}
    for stmt in body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            raise ValueError("api_info holds something other than simple assignments")
        try:
            out[stmt.targets[0].id] = _to_json(stmt.value)
        except RecursionError:
            raise ValueError("api_info nested too deeply") from None
    if not isinstance(out.get("description"), str):
        raise ValueError("api_info has no description")
    return out
