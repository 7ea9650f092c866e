"""Tools: schemas from typed docstrings, argument validation, timeouts, truncation and ToolSet turns."""

import asyncio
import threading
import time
from typing import Literal, Optional

import pytest

from taskrl.tools import (
    DEFAULT_MAX_OUTPUT_CHARS,
    TRUNCATION_MARKER,
    Tool,
    ToolDefinitionError,
    ToolSet,
    call_budget,
    tool,
    truncate_output,
)
from taskrl.types import ToolCall


def call(name: str, arguments: dict | None = None, call_id: str = "call_0") -> ToolCall:
    return ToolCall(call_id, name, {} if arguments is None else arguments)


@tool
def search(
    query: str,
    limit: int,
    threshold: float,
    exact: bool,
    ids: list[int],
    filters: dict,
    mode: Literal["fast", "slow"],
    page: Optional[int] = None,  # noqa: UP045 - the typing spelling is what this test covers
    cursor: str | None = None,
    lang: str = "en",
) -> str:
    """Search the catalogue for matching items.

    Longer explanation that is part of the description.

    Args:
        query: what to look for.
        limit (int): how many results to return,
            at most 100.
        threshold: minimum score.
        exact: only exact matches.
        ids: restrict to these item ids.
        filters: extra field filters.
        mode: search speed.
        page: page number, or none for the first.
        cursor: an opaque cursor.
        lang: result language.

    Returns:
        the results, one per line.
    """
    return f"{query}:{limit}"


VALID = {
    "query": "apple",
    "limit": 3,
    "threshold": 0.5,
    "exact": False,
    "ids": [1, 2],
    "filters": {"color": "red"},
    "mode": "fast",
}


# -- schema ------------------------------------------------------------------------------------


def test_schema_from_typed_google_docstring() -> None:
    assert isinstance(search, Tool)
    fn = search.schema["function"]
    assert search.schema["type"] == "function"
    assert fn["name"] == "search"
    assert fn["description"] == (
        "Search the catalogue for matching items.\n\nLonger explanation that is part of the description."
    )
    params = fn["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["query", "limit", "threshold", "exact", "ids", "filters", "mode"]
    props = params["properties"]
    assert list(props) == [*VALID, "page", "cursor", "lang"]
    assert props["query"] == {"type": "string", "description": "what to look for."}
    assert props["limit"] == {"type": "integer", "description": "how many results to return, at most 100."}
    assert props["threshold"] == {"type": "number", "description": "minimum score."}
    assert props["exact"] == {"type": "boolean", "description": "only exact matches."}
    assert props["ids"] == {"type": "array", "items": {"type": "integer"}, "description": "restrict to these item ids."}
    assert props["filters"] == {"type": "object", "description": "extra field filters."}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "description": "search speed."}
    assert props["page"]["type"] == "integer" and props["page"]["nullable"] is True
    assert props["page"]["default"] is None
    assert props["page"]["description"] == "page number, or none for the first."
    assert props["cursor"]["type"] == "string" and props["cursor"]["nullable"] is True
    assert "nullable" not in props["lang"]
    assert props["lang"] == {"type": "string", "description": "result language.", "default": "en"}
    assert "Returns" not in str(props)


def test_tool_options_and_defaults() -> None:
    @tool(name="renamed", timeout_s=5, cost=0.25, max_output_chars=None, group="io")
    def plain(x: int) -> int:
        """Echo x."""
        return x

    assert plain.name == "renamed"
    assert (plain.timeout_s, plain.cost, plain.max_output_chars, plain.group) == (5, 0.25, None, "io")
    assert plain.parameters == {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    assert search.timeout_s == 30.0 and search.cost == 0.0 and search.group == "default"


def test_tool_without_arguments_or_args_section() -> None:
    @tool
    def ping() -> str:
        """Answer pong."""
        return "pong"

    assert ping.description == "Answer pong."
    assert ping.parameters == {"type": "object", "properties": {}, "required": []}


def test_literal_of_ints_and_mixed_literal() -> None:
    @tool
    def pick(n: Literal[1, 2, 3], tag: Literal["a", 1]) -> str:
        """Pick."""
        return ""

    assert pick.parameters["properties"]["n"] == {"enum": [1, 2, 3], "type": "integer"}
    assert pick.parameters["properties"]["tag"] == {"enum": ["a", 1]}


def test_union_becomes_any_of() -> None:
    @tool
    def either(v: int | str) -> str:
        """Either."""
        return str(v)

    assert either.parameters["properties"]["v"] == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert either.validate({"v": 1}) == [] and either.validate({"v": "x"}) == []
    assert either.validate({"v": 1.5}) == ["argument 'v' has the wrong type (float)"]


def test_optional_union_is_nullable_any_of() -> None:
    @tool
    def maybe(v: int | str | None = None) -> str:
        """Maybe."""
        return str(v)

    prop = maybe.parameters["properties"]["v"]
    assert prop == {"anyOf": [{"type": "integer"}, {"type": "string"}], "nullable": True, "default": None}
    assert maybe.validate({"v": None}) == [] and maybe.validate({"v": "x"}) == []
    assert maybe.validate({"v": [1]}) == ["argument 'v' has the wrong type (list)"]


def test_no_docstring_is_a_definition_error() -> None:
    def undocumented(x: int) -> int:
        return x

    with pytest.raises(ToolDefinitionError, match="undocumented.*docstring"):
        tool(undocumented)


def test_missing_type_hint_is_a_definition_error() -> None:
    def unhinted(x, y: int) -> int:  # noqa: ANN001
        """Add."""
        return x + y

    with pytest.raises(ToolDefinitionError, match="'x' needs a type hint"):
        tool(unhinted)


@pytest.mark.parametrize("variadic", ["args", "kwargs"])
def test_variadic_arguments_are_a_definition_error(variadic: str) -> None:
    if variadic == "args":

        def fn(*args: int) -> int:
            """Sum."""
            return sum(args)
    else:

        def fn(**kwargs: int) -> int:
            """Sum."""
            return sum(kwargs.values())

    with pytest.raises(ToolDefinitionError, match=r"\*args/\*\*kwargs"):
        tool(fn)


def test_unsupported_type_is_a_definition_error() -> None:
    def fn(x: set[int]) -> int:
        """Count."""
        return len(x)

    with pytest.raises(ToolDefinitionError, match="argument 'x'.*unsupported type"):
        tool(fn)


# -- validation --------------------------------------------------------------------------------


def test_valid_arguments_have_no_problems() -> None:
    assert search.validate(VALID) == []
    assert search.validate({**VALID, "page": 2, "cursor": "c", "lang": "de"}) == []
    assert search.validate({**VALID, "ids": []}) == []


def test_int_is_accepted_for_float() -> None:
    assert search.validate({**VALID, "threshold": 1}) == []


def test_optional_argument_accepts_null() -> None:
    assert search.validate({**VALID, "page": None, "cursor": None}) == []
    assert search.validate({**VALID, "query": None}) != []  # a required str is not nullable


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"limit": "3"}, "argument 'limit' must be integer, got str"),
        ({"limit": 3.0}, "argument 'limit' must be integer, got float"),
        ({"limit": True}, "argument 'limit' must be integer, got bool"),
        ({"threshold": "0.5"}, "argument 'threshold' must be number, got str"),
        ({"threshold": False}, "argument 'threshold' must be number, got bool"),
        ({"exact": 1}, "argument 'exact' must be boolean, got int"),
        ({"query": 5}, "argument 'query' must be string, got int"),
        ({"ids": 1}, "argument 'ids' must be array, got int"),
        ({"ids": [1, "2"]}, "argument 'ids'[1] must be integer, got str"),
        ({"ids": [1, True]}, "argument 'ids'[1] must be integer, got bool"),
        ({"filters": []}, "argument 'filters' must be object, got list"),
        ({"mode": "medium"}, "argument 'mode' must be one of ['fast', 'slow'], got 'medium'"),
        ({"page": "2"}, "argument 'page' must be integer, got str"),
    ],
)
def test_wrong_types_are_named(override: dict, expected: str) -> None:
    problems = search.validate({**VALID, **override})
    assert len(problems) == 1, problems
    assert problems[0].startswith(expected), problems


def test_missing_and_unknown_arguments_are_named() -> None:
    args = {k: v for k, v in VALID.items() if k not in ("query", "mode")}
    args["colour"] = "red"
    problems = search.validate(args)
    assert "missing required argument 'query'" in problems
    assert "missing required argument 'mode'" in problems
    unknown = [p for p in problems if "colour" in p]
    assert len(unknown) == 1 and unknown[0].startswith("unknown argument 'colour' (expected: query, limit,")
    assert len(problems) == 3


def test_non_object_arguments() -> None:
    assert search.validate([1, 2]) == ["arguments must be a JSON object, got list"]


async def test_invalid_call_is_an_error_result_and_the_tool_does_not_run() -> None:
    ran = []

    @tool
    def record(n: int) -> str:
        """Record n."""
        ran.append(n)
        return "ok"

    result = await record(call("record", {"n": "1"}, call_id="call_7"))
    assert result.is_error and result.call_id == "call_7" and result.name == "record"
    assert result.content.startswith("Invalid call to 'record': argument 'n' must be integer")
    assert ran == []


# -- running -----------------------------------------------------------------------------------


async def test_sync_and_async_tools_run() -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool
    async def shout(text: str) -> str:
        """Upper-case text."""
        await asyncio.sleep(0)
        return text.upper()

    r1 = await add(call("add", {"a": 2, "b": 3}, "c1"))
    r2 = await shout(call("shout", {"text": "hé"}, "c2"))
    assert (r1.content, r1.is_error, r1.call_id, r1.name) == ("5", False, "c1", "add")
    assert (r2.content, r2.is_error, r2.call_id) == ("HÉ", False, "c2")


async def test_defaults_are_used_when_omitted() -> None:
    result = await search(call("search", {**VALID, "query": "pear"}))
    assert result.content == "pear:3"


async def test_non_string_output_is_json() -> None:
    @tool
    def info() -> dict:
        """Info."""
        return {"name": "äpfel", "n": [1, 2], "none": None}

    @tool
    def nothing() -> None:
        """Nothing."""

    assert (await info(call("info"))).content == '{"name": "äpfel", "n": [1, 2], "none": null}'
    assert (await nothing(call("nothing"))).content == "null"


@pytest.mark.parametrize("is_async", [False, True])
async def test_raising_tool_gives_an_error_result_naming_the_exception(is_async: bool) -> None:
    if is_async:

        async def boom(x: int) -> str:
            """Fail."""
            raise ValueError(f"bad value {x}")
    else:

        def boom(x: int) -> str:
            """Fail."""
            raise ValueError(f"bad value {x}")

    result = await tool(boom)(call("boom", {"x": 4}, "call_3"))
    assert result.is_error and result.call_id == "call_3"
    assert result.content == "Tool 'boom' failed: ValueError: bad value 4"


async def test_tool_raising_timeout_error_itself_is_not_reported_as_our_timeout() -> None:
    @tool(timeout_s=10)
    def upstream() -> str:
        """Call a slow service."""
        raise TimeoutError("upstream took too long")

    result = await upstream(call("upstream"))
    assert result.is_error
    assert result.content == "Tool 'upstream' failed: TimeoutError: upstream took too long"


async def test_hanging_async_tool_times_out() -> None:
    @tool(timeout_s=0.1)
    async def hang() -> str:
        """Hang."""
        await asyncio.sleep(30)
        return "never"

    start = time.perf_counter()
    result = await hang(call("hang", call_id="call_9"))
    elapsed = time.perf_counter() - start
    assert result.is_error and result.call_id == "call_9"
    assert result.content == "Tool 'hang' timed out after 0.1s"
    assert 0.09 <= elapsed < 0.5


async def test_hanging_sync_tool_times_out() -> None:
    release = threading.Event()

    @tool(timeout_s=0.15)
    def hang() -> str:
        """Hang in a blocking call."""
        release.wait(5)  # stands in for time.sleep; released below so the worker thread ends
        return "late"

    start = time.perf_counter()
    try:
        result = await hang(call("hang"))
        elapsed = time.perf_counter() - start
    finally:
        release.set()
    assert result.is_error
    assert result.content.startswith("Tool 'hang' timed out after 0.15s")
    assert "still ending in the background" in result.content  # it ignores its budget: the model is told
    assert 0.14 <= elapsed < 0.6


async def test_blocking_time_sleep_tool_times_out() -> None:
    @tool(timeout_s=0.05)
    def nap() -> str:
        """Sleep."""
        time.sleep(0.3)
        return "rested"

    start = time.perf_counter()
    result = await nap(call("nap"))
    assert time.perf_counter() - start < 0.25
    assert result.is_error and "timed out after 0.05s" in result.content


async def test_no_timeout_when_timeout_is_none() -> None:
    @tool(timeout_s=None)
    async def quick() -> str:
        """Quick."""
        await asyncio.sleep(0.01)
        return "done"

    assert (await quick(call("quick"))).content == "done"


async def test_output_is_truncated_with_a_marker_and_the_dropped_count() -> None:
    @tool(max_output_chars=10)
    def long() -> str:
        """Long output."""
        return "abcdefghij" + "x" * 25

    result = await long(call("long"))
    assert not result.is_error
    assert result.content == "abcdefghij" + TRUNCATION_MARKER.format(n=25)
    assert result.content.endswith("[... output truncated: 25 more characters ...]")


def test_truncate_output_edges() -> None:
    assert truncate_output("abc", 3) == "abc"
    assert truncate_output("abcd", 3) == "abc\n[... output truncated: 1 more characters ...]"
    assert truncate_output("a" * 100_000, None) == "a" * 100_000
    assert truncate_output("", 0) == ""


async def test_default_cap_applies() -> None:
    @tool
    def huge() -> str:
        """Huge."""
        return "y" * 9000

    content = (await huge(call("huge"))).content
    assert content.startswith("y" * 8000 + "\n[... output truncated: 1000 more")


# -- methods and ToolSet -----------------------------------------------------------------------


class Counter:
    def __init__(self, start: int) -> None:
        self.value = start

    @tool(cost=0.5)
    def increment(self, by: int = 1) -> str:
        """Add to the counter.

        Args:
            by: how much to add.
        """
        self.value += by
        return str(self.value)

    @tool
    async def read(self) -> str:
        """Read the counter."""
        return str(self.value)

    def not_a_tool(self) -> None:
        """Ignored."""


async def test_tool_methods_bind_to_their_instance() -> None:
    a, b = Counter(10), Counter(100)
    tools_a, tools_b = ToolSet.from_object(a), ToolSet.from_object(b)
    assert sorted(tools_a.names) == ["increment", "read"]
    assert "self" not in tools_a["increment"].parameters["properties"]
    assert tools_a["increment"].parameters["properties"]["by"] == {
        "type": "integer",
        "description": "how much to add.",
        "default": 1,
    }
    results = await tools_a.execute([call("increment", {"by": 5}, "c0"), call("read", {}, "c1")])
    assert not any(r.is_error for r in results), results
    assert a.value == 15 and b.value == 100
    assert (await tools_b.execute([call("increment")]))[0].content == "101"
    assert Counter.increment.takes_self  # the class attribute stays unbound
    assert not a.increment.takes_self
    assert tools_a["increment"].cost == 0.5


def test_toolset_from_object_max_parallel_and_groups() -> None:
    tools = ToolSet.from_object(Counter(0), max_parallel=2)
    assert tools.max_parallel == 2
    assert tools.groups() == {"default": ["increment", "read"]}
    assert [s["function"]["name"] for s in tools.schemas()] == ["increment", "read"]
    assert "read" in tools and "nope" not in tools
    assert [t.name for t in tools] == ["increment", "read"]


def _named(name: str, *, cost: float = 0.0, delay: float = 0.0) -> Tool:
    async def fn(x: int = 0) -> str:
        """A test tool."""
        await asyncio.sleep(delay)
        return f"{name}:{x}"

    return tool(fn, name=name, cost=cost)


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(ToolDefinitionError, match="two tools are named 'a'"):
        ToolSet([_named("a"), _named("b"), _named("a")])


@pytest.mark.parametrize("bad", [0, -1])
def test_max_parallel_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="max_parallel"):
        ToolSet([_named("a")], max_parallel=bad)


async def test_max_parallel_rejects_extra_calls_in_call_order() -> None:
    tools = ToolSet([_named("slow", delay=0.05), _named("fast")], max_parallel=2)
    calls = [
        call("slow", {"x": 1}, "c0"),
        call("fast", {"x": 2}, "c1"),
        call("fast", {"x": 3}, "c2"),
        call("slow", {"x": 4}, "c3"),
    ]
    results = await tools.execute(calls)
    assert [r.call_id for r in results] == ["c0", "c1", "c2", "c3"]
    assert [r.name for r in results] == ["slow", "fast", "fast", "slow"]
    assert [r.content for r in results[:2]] == ["slow:1", "fast:2"]
    assert [r.is_error for r in results] == [False, False, True, True]
    for r in results[2:]:
        assert r.content == "Too many tool calls in one turn: at most 2 run; this one did not."


async def test_calls_in_one_turn_run_concurrently() -> None:
    tools = ToolSet([_named("a", delay=0.2), _named("b", delay=0.2)])
    start = time.perf_counter()
    results = await tools.execute([call("a", {}, "c0"), call("b", {}, "c1")])
    elapsed = time.perf_counter() - start
    assert [r.content for r in results] == ["a:0", "b:0"]
    assert elapsed < 0.35, f"calls ran one after another ({elapsed:.2f}s)"


async def test_sync_calls_in_one_turn_run_concurrently() -> None:
    def nap(x: int = 0) -> str:
        """Sleep."""
        time.sleep(0.2)
        return str(x)

    tools = ToolSet([tool(nap, name="nap1"), tool(nap, name="nap2")])
    start = time.perf_counter()
    results = await tools.execute([call("nap1", {"x": 1}), call("nap2", {"x": 2})])
    assert [r.content for r in results] == ["1", "2"]
    assert time.perf_counter() - start < 0.35


async def test_sequential_calls_run_in_call_order_and_see_each_others_state() -> None:
    """Tools sharing state (search's shown chunks, a workspace): each call sees what the calls before it left,
    however long each takes, so a turn's observations depend only on its calls."""
    shown: list[int] = []

    def claim(x: int, delay: float = 0.0) -> str:
        """Append x after a nap and return everything so far."""
        time.sleep(delay)
        shown.append(x)
        return ",".join(map(str, shown))

    tools = ToolSet([tool(claim)], sequential=True)
    calls = [call("claim", {"x": 1, "delay": 0.1}), call("claim", {"x": "bad"}), call("claim", {"x": 2})]
    results = await tools.execute(calls)
    assert [r.content for r in results[::2]] == ["1", "1,2"]
    assert results[1].is_error and "must be integer" in results[1].content


def test_tool_envs_that_share_state_run_their_calls_in_order() -> None:
    from taskrl.env import ToolEnv
    from taskrl.envs.search.env import SearchEnv

    assert SearchEnv.sequential_tools and not ToolEnv.sequential_tools

    class Shared(ToolEnv):
        sequential_tools = True

    assert Shared().tools.sequential and not ToolEnv().tools.sequential


async def test_one_failing_call_does_not_affect_the_others() -> None:
    @tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("disk full")

    tools = ToolSet([broken, _named("ok")])
    results = await tools.execute([call("broken", {}, "c0"), call("ok", {"x": 1}, "c1"), call("ok", {"x": "1"}, "c2")])
    assert results[0].is_error and "RuntimeError: disk full" in results[0].content
    assert not results[1].is_error and results[1].content == "ok:1"
    assert results[2].is_error and results[2].content.startswith("Invalid call to 'ok': argument 'x' must be integer")
    assert results[2].content.endswith(".")


def test_cost_adds_up() -> None:
    tools = ToolSet([_named("a", cost=0.5), _named("b", cost=0.25), _named("free")])
    calls = [call("a"), call("b"), call("a"), call("free"), call("unknown")]
    assert tools.cost(calls) == pytest.approx(1.25)
    assert tools.cost([]) == 0.0


async def test_unknown_tool_message_lists_available_tools() -> None:
    tools = ToolSet([_named("alpha"), _named("beta")])
    assert tools.check_call(call("gamma")) == "Unknown tool 'gamma'. Available tools: alpha, beta."
    results = await tools.execute([call("gamma", {}, "call_5")])
    assert results[0].is_error and results[0].call_id == "call_5" and results[0].name == "gamma"
    assert results[0].content == "Unknown tool 'gamma'. Available tools: alpha, beta."
    assert ToolSet().check_call(call("x")) == "Unknown tool 'x'. Available tools: none."


async def test_execute_empty_turn() -> None:
    assert await ToolSet([_named("a")]).execute([]) == []


def _tool_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"taskrl-tool-{name}"]


async def test_timeout_stops_a_cooperative_tool_and_its_thread_ends() -> None:
    scanned = []

    @tool(timeout_s=0.2)
    def scan() -> str:
        """Scan forever, checking the call budget between pieces of work."""
        budget = call_budget()
        assert budget is not None
        while True:
            budget.check()  # raises ToolStopped once the call is stopped
            scanned.append(1)
            time.sleep(0.005)

    result = await scan(call("scan"))
    assert result.is_error and result.content.startswith("Tool 'scan' timed out after 0.2s")
    for thread in _tool_threads("scan"):
        thread.join(10)  # generous: the machine may be loaded; the point is that it ends at all
    assert _tool_threads("scan") == []
    count = len(scanned)
    time.sleep(0.05)
    assert len(scanned) == count > 0  # no work after the call ended
    assert call_budget() is None  # the budget does not leak out of the call


async def test_tool_threads_are_daemons_and_end_after_normal_calls() -> None:
    seen = {}

    @tool
    def where() -> str:
        """Report the thread the call runs in."""
        seen["thread"] = threading.current_thread()
        return "ok"

    assert (await where(call("where"))).content == "ok"
    seen["thread"].join(10)
    assert seen["thread"].daemon and not seen["thread"].is_alive()


async def test_error_messages_are_capped_like_results() -> None:
    @tool
    def prune(chunk_ids: list[str]) -> str:
        """Fail with a message naming every id."""
        raise KeyError("unknown chunk ids: " + ", ".join(chunk_ids))

    ids = [f"doc{i}#{i}" for i in range(100_000)]
    result = await prune(call("prune", {"chunk_ids": ids}))
    assert result.is_error and "more characters" in result.content
    assert len(result.content) <= DEFAULT_MAX_OUTPUT_CHARS + 80
    bad_types = await prune(call("prune", {"chunk_ids": list(range(100_000))}))
    assert bad_types.is_error and bad_types.content.startswith("Invalid call to 'prune'")
    assert len(bad_types.content) <= DEFAULT_MAX_OUTPUT_CHARS + 80
    (via_set,) = await ToolSet([prune]).execute([call("prune", {"chunk_ids": list(range(100_000))})])
    assert via_set.is_error and len(via_set.content) <= DEFAULT_MAX_OUTPUT_CHARS + 80
