"""Parsing model output: Hermes <tool_call> blocks and OpenAI tool_calls into valid and invalid calls."""

import json
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taskrl.chat import format_tool_call
from taskrl.parsing import CALL_FORMAT_HINT, ParsedTurn, parse_hermes, parse_openai
from taskrl.tools import ToolSet, tool
from taskrl.types import ToolCall


@tool
def lookup(item: str) -> str:
    """Look up an item.

    Args:
        item: the item.
    """
    return item


@tool
def compute(
    a: int,
    b: float,
    flags: list[bool],
    mode: Literal["sum", "product"] = "sum",
    note: str | None = None,
    extra: dict | None = None,
    matrix: list[list[int]] | None = None,
) -> str:
    """Compute something."""
    return ""


TOOLS = ToolSet([lookup, compute])


def single_error(turn: ParsedTurn) -> str:
    assert len(turn.all_calls) == 1 and len(turn.invalid) == 1 and not turn.tool_calls
    call, result = turn.invalid[0]
    assert result.is_error and result.call_id == call.id and result.name == call.name
    return result.content


# -- well-formed calls -------------------------------------------------------------------------


def test_one_call() -> None:
    turn = parse_hermes('<tool_call>\n{"name": "lookup", "arguments": {"item": "apple"}}\n</tool_call>', TOOLS)
    assert turn.tool_calls == [ToolCall("call_0", "lookup", {"item": "apple"})]
    assert turn.all_calls == turn.tool_calls
    assert turn.invalid == [] and turn.content == "" and not turn.is_final


def test_several_calls_keep_text_outside_as_content() -> None:
    text = (
        "Let me check.\n"
        '<tool_call>{"name": "lookup", "arguments": {"item": "apple"}}</tool_call>\n'
        "and then\n"
        '<tool_call>{"name": "lookup", "arguments": {"item": "pear"}}</tool_call>\n'
        "done."
    )
    turn = parse_hermes(text, TOOLS)
    assert [c.arguments["item"] for c in turn.tool_calls] == ["apple", "pear"]
    assert [c.id for c in turn.tool_calls] == ["call_0", "call_1"]
    assert turn.content == "Let me check.\n\nand then\n\ndone."
    assert "tool_call" not in turn.content


def test_call_ids_start_at_offset_and_use_the_prefix() -> None:
    one = '<tool_call>{"name": "lookup", "arguments": {"item": "x"}}</tool_call>'
    turn = parse_hermes(one * 3, TOOLS, start=5)
    assert [c.id for c in turn.all_calls] == ["call_5", "call_6", "call_7"]
    turn = parse_hermes(one + "<tool_call>oops</tool_call>", TOOLS, id_prefix="t3", start=2)
    assert [c.id for c in turn.all_calls] == ["t3_2", "t3_3"]
    assert turn.invalid[0][1].call_id == "t3_3"


def test_fenced_json_inside_the_tag() -> None:
    for fence in ("```json\n", "```\n", "```json "):
        text = f'<tool_call>\n{fence}{{"name": "lookup", "arguments": {{"item": "tea"}}}}\n```\n</tool_call>'
        turn = parse_hermes(text, TOOLS)
        assert turn.tool_calls == [ToolCall("call_0", "lookup", {"item": "tea"})], fence


def test_double_encoded_string_arguments() -> None:
    body = json.dumps({"name": "lookup", "arguments": json.dumps({"item": "milk"})})
    turn = parse_hermes(f"<tool_call>{body}</tool_call>", TOOLS)
    assert turn.tool_calls == [ToolCall("call_0", "lookup", {"item": "milk"})]


def test_empty_string_arguments_mean_no_arguments() -> None:
    turn = parse_hermes('<tool_call>{"name": "lookup", "arguments": "  "}</tool_call>')
    assert turn.tool_calls == [ToolCall("call_0", "lookup", {})]


def test_missing_arguments_mean_no_arguments() -> None:
    turn = parse_hermes('<tool_call>{"name": "lookup"}</tool_call>')
    assert turn.tool_calls == [ToolCall("call_0", "lookup", {})]
    # with the tool known, the missing argument is reported
    turn = parse_hermes('<tool_call>{"name": "lookup"}</tool_call>', TOOLS)
    assert "missing required argument 'item'" in single_error(turn)


def test_parameters_alias() -> None:
    turn = parse_hermes('<tool_call>{"name": "lookup", "parameters": {"item": "rice"}}</tool_call>', TOOLS)
    assert turn.tool_calls == [ToolCall("call_0", "lookup", {"item": "rice"})]


def test_without_toolset_calls_are_not_validated() -> None:
    turn = parse_hermes('<tool_call>{"name": "anything", "arguments": {"x": 1}}</tool_call>')
    assert turn.tool_calls == [ToolCall("call_0", "anything", {"x": 1})]


# -- malformed calls ---------------------------------------------------------------------------


def test_unterminated_tag() -> None:
    turn = parse_hermes('I will call <tool_call>{"name": "lookup", "arguments": {"item": "apple"}}\n', TOOLS)
    content = single_error(turn)
    assert "missing the closing </tool_call> tag" in content and CALL_FORMAT_HINT in content
    # the call keeps what the model meant, so the assistant message shows it
    assert turn.all_calls[0].name == "lookup" and turn.all_calls[0].arguments == {"item": "apple"}
    assert turn.content == "I will call"
    assert not turn.is_final


def test_unterminated_call_does_not_swallow_the_next_one() -> None:
    text = '<tool_call>{"name": "lookup", <tool_call>{"name": "lookup", "arguments": {"item": "tea"}}</tool_call>'
    turn = parse_hermes(text, TOOLS)
    assert [c.id for c in turn.all_calls] == ["call_0", "call_1"]
    assert [c.id for c, _ in turn.invalid] == ["call_0"]
    assert "not valid JSON" in turn.invalid[0][1].content
    assert turn.tool_calls == [ToolCall("call_1", "lookup", {"item": "tea"})]


def test_bad_json() -> None:
    turn = parse_hermes('<tool_call>{"name": "lookup", "arguments": {"item": apple}}</tool_call>', TOOLS)
    content = single_error(turn)
    assert content.startswith("Invalid tool call: not valid JSON (")
    assert CALL_FORMAT_HINT in content
    call = turn.all_calls[0]
    assert call.name == "invalid_tool_call"
    assert call.arguments == {"__raw__": '{"name": "lookup", "arguments": {"item": apple}}'}


@pytest.mark.parametrize("body", ['["lookup", {"item": "x"}]', '"lookup"', "42", "null"])
def test_non_object(body: str) -> None:
    content = single_error(parse_hermes(f"<tool_call>{body}</tool_call>", TOOLS))
    assert content.startswith("Invalid tool call: it must be a JSON object.")


@pytest.mark.parametrize("body", ['{"arguments": {"item": "x"}}', '{"name": "", "arguments": {}}', '{"name": 3}'])
def test_missing_name(body: str) -> None:
    turn = parse_hermes(f"<tool_call>{body}</tool_call>", TOOLS)
    assert single_error(turn).startswith('Invalid tool call: it has no "name" string.')
    assert turn.all_calls[0].name == "invalid_tool_call"


@pytest.mark.parametrize("arguments", ["[1, 2]", "3", "null", '"[1, 2]"', '"7"'])
def test_arguments_not_an_object(arguments: str) -> None:
    turn = parse_hermes(f'<tool_call>{{"name": "lookup", "arguments": {arguments}}}</tool_call>', TOOLS)
    assert "the arguments of 'lookup' must be a JSON object" in single_error(turn)
    assert turn.all_calls[0].name == "lookup" and "__raw__" in turn.all_calls[0].arguments


def test_double_encoded_arguments_that_are_not_json() -> None:
    turn = parse_hermes('<tool_call>{"name": "lookup", "arguments": "{item: apple}"}</tool_call>', TOOLS)
    assert "arguments of 'lookup' are not valid JSON" in single_error(turn)


def test_unknown_tool() -> None:
    turn = parse_hermes('<tool_call>{"name": "order", "arguments": {}}</tool_call>', TOOLS)
    assert single_error(turn) == "Unknown tool 'order'. Available tools: lookup, compute."
    assert turn.all_calls[0].name == "order"


def test_wrong_argument_types() -> None:
    body = json.dumps({"name": "compute", "arguments": {"a": "1", "b": 2, "flags": [True, 1], "mode": "max"}})
    content = single_error(parse_hermes(f"<tool_call>{body}</tool_call>", TOOLS))
    assert content.startswith("Invalid call to 'compute':")
    assert "argument 'a' must be integer, got str" in content
    assert "argument 'flags'[1] must be boolean, got int" in content
    assert "argument 'mode' must be one of ['sum', 'product'], got 'max'" in content
    assert "argument 'b'" not in content  # an int is a fine float


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "lookup", "arguments": {"item": ' + "9" * 5000 + "}}",  # past Python's int/str digit limit
        json.dumps({"name": "lookup", "arguments": '{"item": ' + "9" * 5000 + "}"}),
        "[" * 100_000 + "]" * 100_000,
        json.dumps({"name": "lookup", "arguments": "[" * 100_000}),
    ],
    ids=["huge-int", "huge-int-double-encoded", "deep", "deep-double-encoded"],
)
def test_json_python_cannot_hold_is_an_invalid_call_not_a_crash(body: str) -> None:
    content = single_error(parse_hermes(f"<tool_call>{body}</tool_call>", TOOLS))
    assert "not valid JSON" in content


def test_valid_and_invalid_calls_in_written_order() -> None:
    text = (
        '<tool_call>{"name": "lookup", "arguments": {"item": "a"}}</tool_call>'
        "<tool_call>not json</tool_call>"
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": {"item": "b"}}</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": {"item": 1}}'
    )
    turn = parse_hermes(text, TOOLS)
    assert [c.id for c in turn.all_calls] == [f"call_{i}" for i in range(5)]
    assert [c.name for c in turn.all_calls] == ["lookup", "invalid_tool_call", "nope", "lookup", "lookup"]
    assert [c.id for c in turn.tool_calls] == ["call_0", "call_3"]
    assert [c.id for c, _ in turn.invalid] == ["call_1", "call_2", "call_4"]
    assert all(r.is_error and r.call_id == c.id for c, r in turn.invalid)
    assert not turn.is_final


# -- final answers -----------------------------------------------------------------------------


def test_no_calls_is_final() -> None:
    turn = parse_hermes("The total is 17.", TOOLS)
    assert turn.is_final and turn.all_calls == [] and turn.content == "The total is 17."
    assert turn.final_answer == "The total is 17."


def test_only_invalid_calls_is_not_final() -> None:
    assert not parse_hermes("<tool_call>garbage</tool_call>", TOOLS).is_final


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Thinking...\n<answer> 17 </answer>", "17"),
        ("<answer>\nmulti\nline\n</answer> trailing", "multi\nline"),
        ("<answer>unclosed 42", "unclosed 42"),
        ("  plain  ", "plain"),
        ("<answer>first</answer><answer>second</answer>", "first"),
    ],
)
def test_final_answer_strips_answer_tags(text: str, answer: str) -> None:
    turn = parse_hermes(text, TOOLS)
    assert turn.is_final and turn.final_answer == answer


# -- OpenAI tool_calls -------------------------------------------------------------------------


def test_parse_openai_valid_and_raw_arguments() -> None:
    calls = [
        ToolCall("a1", "lookup", {"item": "apple"}),
        ToolCall("a2", "lookup", {"__raw__": '{"item": "app'}),
        ToolCall("a3", "nope", {}),
        ToolCall("a4", "lookup", {"item": 3}),
    ]
    turn = parse_openai("  checking  ", calls, TOOLS)
    assert turn.content == "checking"
    assert turn.all_calls == calls
    assert turn.tool_calls == [calls[0]]
    errors = {c.id: r.content for c, r in turn.invalid}
    assert errors["a2"] == "the arguments of 'lookup' are not valid JSON. Send a JSON object."
    assert errors["a3"].startswith("Unknown tool 'nope'")
    assert errors["a4"].startswith("Invalid call to 'lookup': argument 'item' must be string")
    assert not turn.is_final


def test_parse_openai_without_calls_is_final() -> None:
    turn = parse_openai(None, [], TOOLS)
    assert turn.is_final and turn.content == "" and turn.final_answer == ""


def test_parse_openai_raw_plus_other_arguments_is_just_validated() -> None:
    turn = parse_openai("", [ToolCall("a1", "x", {"__raw__": "s", "y": 1})])
    assert turn.tool_calls and not turn.invalid


# -- properties --------------------------------------------------------------------------------

_FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call>\n",
    "\n</tool_call>",
    "<answer>",
    "</answer>",
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    "```json\n",
    "```",
    '"name"',
    '"arguments"',
    '"parameters"',
    '"lookup"',
    '"compute"',
    '{"item": "x"}',
    '"{\\"item\\": 1}"',
    "null",
    "1e999",
    "-0",
    "\\u0000",
    '{"name": "lookup", "arguments": {"item": "apple"}}',
    '{"name": "compute", "arguments": {"a": 1, "b": 2.5, "flags": []}}',
]
_noisy_text = st.lists(st.sampled_from(_FRAGMENTS) | st.text(max_size=12), max_size=25).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_noisy_text, st.integers(0, 50), st.booleans())
def test_random_text_never_raises_and_each_tag_yields_one_call(text: str, start: int, with_tools: bool) -> None:
    turn = parse_hermes(text, TOOLS if with_tools else None, start=start)
    n = text.count("<tool_call>")
    assert len(turn.all_calls) == n
    assert [c.id for c in turn.all_calls] == [f"call_{start + i}" for i in range(n)]
    assert len(turn.tool_calls) + len(turn.invalid) == n
    by_id = {c.id: c for c in turn.all_calls}
    for call in turn.tool_calls:
        assert by_id[call.id] is call
        assert isinstance(call.arguments, dict)
        if with_tools:
            assert TOOLS.check_call(call) is None
    for call, result in turn.invalid:
        assert by_id[call.id] is call
        assert result.is_error and result.call_id == call.id and result.content
        assert isinstance(call.arguments, dict)
    assert turn.is_final == (n == 0)
    assert isinstance(turn.final_answer, str)
    json.dumps([c.arguments for c in turn.all_calls])  # every call can go into an assistant message


def _no_tags(s: str) -> bool:
    # A string argument holding a literal tag is ambiguous in Hermes text; nothing can parse it back.
    return "<tool_call>" not in s and "</tool_call>" not in s


_strings = st.text(max_size=20).filter(_no_tags)
_json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_strings, inner, max_size=3),
    max_leaves=6,
)


def _value_for(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        base = st.sampled_from(schema["enum"])
    elif "anyOf" in schema:
        base = st.one_of([_value_for(s) for s in schema["anyOf"]])
    else:
        base = {
            "string": _strings,
            "integer": st.integers(),
            "number": st.integers() | st.floats(allow_nan=False, allow_infinity=False),
            "boolean": st.booleans(),
            "array": st.lists(_value_for(schema.get("items", {})), max_size=4)
            if schema.get("items")
            else st.lists(_json_value, max_size=3),
            "object": st.dictionaries(_strings, _json_value, max_size=3),
        }[schema["type"]]
    return st.none() | base if schema.get("nullable") else base


@st.composite
def _valid_call(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from(TOOLS.names))
    params = TOOLS[name].parameters
    arguments = {}
    for arg, schema in params["properties"].items():
        if arg in params["required"] or draw(st.booleans()):
            arguments[arg] = draw(_value_for(schema))
    return name, arguments


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_valid_call(), min_size=1, max_size=3), st.text(max_size=20).filter(_no_tags))
def test_valid_calls_round_trip_through_format_tool_call(calls: list, prose: str) -> None:
    text = prose + "\n" + "\n".join(format_tool_call(name, args) for name, args in calls)
    turn = parse_hermes(text, TOOLS)
    assert turn.invalid == []
    assert [(c.name, c.arguments) for c in turn.tool_calls] == calls
    assert [c.id for c in turn.tool_calls] == [f"call_{i}" for i in range(len(calls))]
    assert turn.content == prose.strip()
