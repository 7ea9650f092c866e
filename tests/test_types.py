"""Core types: exact JSONL round-trips, Segment invariants, reward terms and the schema version."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskrl.types import (
    SCHEMA_VERSION,
    Message,
    SchemaVersionError,
    Segment,
    Task,
    ToolCall,
    ToolResult,
    Trajectory,
    finite_mean,
    read_jsonl,
    write_jsonl,
)


def _nested_trajectory() -> Trajectory:
    call = ToolCall("call_0", "lookup_price", {"item": "äpfel 🍎", "qty": [1, 2], "opts": {"x": None}})
    child = Trajectory(
        task_id="sub-1",
        env="shop",
        segments=[Segment([5, 6], [-0.5, 1e-300], [1, 1], policy_version=3)],
        messages=[Message("user", "summarise"), Message("assistant", "ok")],
        rewards={"correct": None},
        trainable=False,
    )
    grandchild = Trajectory(task_id="sub-2", rewards={"x": -0.0}, info={"depth": 2})
    child.children.append(grandchild)
    grandchild.parent_id = child.id
    parent = Trajectory(
        task_id="shop-0-0",
        env="shop",
        group_id="g1",
        segments=[
            Segment([1, 2, 3], [0.0, 0.1 + 0.2, -1e-300], [0, 1, 1], policy_version=7),
            Segment([4], [0.0], [0]),
        ],
        messages=[
            Message("system", "Ünïcödé ✓ — 你好"),
            Message("assistant", "", tool_calls=[call]),
            Message.from_result(ToolResult("call_0", "lookup_price", 'apple: $3 "quoted"\n\ttab')),
        ],
        rewards={"correct": 1.0, "format": None, "length": 0.1 + 0.2},
        metrics={"invalid_tool_calls": 0.0, "turns": 2.0, "tiny": 1e-300, "huge": 1.7976931348623157e308},
        terminated=True,
        seed=42,
        children=[child],
        info={"final_answer": "17", "nested": {"list": [1, 2.5, "x", None, True]}},
    )
    child.parent_id = parent.id
    return parent


def test_trajectory_json_round_trip_is_exact() -> None:
    traj = _nested_trajectory()
    again = Trajectory.from_json(traj.to_json())
    assert again == traj
    assert again.to_json() == traj.to_json()
    # the types come back, not just equal-looking dicts
    assert isinstance(again.segments[0], Segment)
    assert isinstance(again.messages[1].tool_calls[0], ToolCall)
    assert isinstance(again.children[0], Trajectory)
    assert isinstance(again.children[0].children[0], Trajectory)
    assert again.children[0].children[0].parent_id == traj.children[0].id
    assert again.segments[0].logprobs[1] == 0.1 + 0.2  # not 0.3
    assert again.segments[0].logprobs[2] == -1e-300
    assert again.rewards["format"] is None
    assert "format" in again.rewards
    assert again.messages[0].content == "Ünïcödé ✓ — 你好"


def test_to_json_is_one_line_and_keeps_unicode_readable() -> None:
    line = _nested_trajectory().to_json()
    assert "\n" not in line
    assert "你好" in line  # ensure_ascii=False
    assert json.loads(line)["schema_version"] == SCHEMA_VERSION


def test_message_to_openai_shape() -> None:
    call = ToolCall("call_1", "calc", {"expression": "1+2"})
    out = Message("assistant", "thinking", tool_calls=[call]).to_openai()
    assert out == {
        "role": "assistant",
        "content": "thinking",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expression": "1+2"}'}}
        ],
    }
    tool_msg = Message.from_result(ToolResult("call_1", "calc", "3"))
    assert tool_msg.to_openai() == {"role": "tool", "content": "3", "tool_call_id": "call_1", "name": "calc"}
    assert Message.from_dict({"role": "assistant", "content": None}).content == ""


# -- hypothesis-generated trajectories ---------------------------------------------------------

_floats = st.floats(allow_nan=False, allow_infinity=False)
_text = st.text(max_size=20)
_json_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | _floats | _text
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def _segments(draw: st.DrawFn) -> Segment:
    n = draw(st.integers(0, 6))
    return Segment(
        token_ids=draw(st.lists(st.integers(0, 200_000), min_size=n, max_size=n)),
        logprobs=draw(st.lists(_floats, min_size=n, max_size=n)),
        loss_mask=draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)),
        policy_version=draw(st.integers(0, 1000)),
    )


_calls = st.builds(ToolCall, id=_text, name=_text, arguments=st.dictionaries(_text, _json, max_size=3))
_messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=_text,
    tool_calls=st.lists(_calls, max_size=2),
    tool_call_id=st.none() | _text,
    name=st.none() | _text,
)


def _trajectories(children: st.SearchStrategy[list[Trajectory]]) -> st.SearchStrategy[Trajectory]:
    return st.builds(
        Trajectory,
        id=_text,
        task_id=_text,
        env=_text,
        group_id=st.none() | _text,
        segments=st.lists(_segments(), max_size=3),
        messages=st.lists(_messages, max_size=3),
        rewards=st.dictionaries(_text, st.none() | _floats, max_size=3),
        metrics=st.dictionaries(_text, _floats, max_size=3),
        terminated=st.booleans(),
        truncated=st.booleans(),
        error=st.none() | _text,
        parent_id=st.none() | _text,
        children=children,
        trainable=st.booleans(),
        seed=st.none() | st.integers(-(2**31), 2**31),
        info=st.dictionaries(_text, _json, max_size=3),
    )


_any_trajectory = st.recursive(
    _trajectories(st.just([])),
    lambda inner: _trajectories(st.lists(inner, max_size=2)),
    max_leaves=4,
)


@settings(max_examples=60, deadline=None)
@given(_any_trajectory)
def test_generated_trajectories_round_trip_exactly(traj: Trajectory) -> None:
    line = traj.to_json()
    assert "\n" not in line  # one record per JSONL line, whatever the strings hold
    again = Trajectory.from_json(line)
    assert again == traj
    assert again.reward == traj.reward


@settings(max_examples=15, deadline=None)
@given(st.lists(_any_trajectory, max_size=3))
def test_generated_trajectories_round_trip_through_jsonl(tmp_path_factory: pytest.TempPathFactory, trajs) -> None:
    path = tmp_path_factory.mktemp("jsonl") / "t.jsonl"
    write_jsonl(str(path), trajs, append=False)
    assert read_jsonl(str(path)) == trajs


# -- Segment -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"token_ids": [1, 2], "logprobs": [0.0], "loss_mask": [0, 0]},
        {"token_ids": [1], "logprobs": [0.0], "loss_mask": []},
        {"token_ids": [], "logprobs": [0.0], "loss_mask": [1]},
    ],
)
def test_segment_rejects_mismatched_lengths(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="Segment lengths differ"):
        Segment(**kwargs)


def test_segment_from_dict_with_mismatched_lengths_is_refused() -> None:
    data = _nested_trajectory().to_dict()
    data["segments"][0]["logprobs"].pop()
    with pytest.raises(ValueError, match="Segment lengths differ"):
        Trajectory.from_dict(data)


def test_segment_append_sampled_and_forced() -> None:
    seg = Segment(policy_version=2)
    seg.append([10, 11], sampled=False)
    seg.append([12, 13, 14], sampled=True, logprobs=[-0.1, -0.2, -0.3])
    seg.append([15], sampled=False, logprobs=[-9.0])  # forced tokens never keep a logprob
    assert seg.token_ids == [10, 11, 12, 13, 14, 15]
    assert seg.loss_mask == [0, 0, 1, 1, 1, 0]
    assert seg.logprobs == [0.0, 0.0, -0.1, -0.2, -0.3, 0.0]
    assert len(seg) == 6
    assert seg.num_sampled == 3
    assert seg.policy_version == 2


def test_segment_append_coerces_numpy_like_values() -> None:
    seg = Segment()
    seg.append([True, 7.0], sampled=True, logprobs=[-1, 0])  # type: ignore[list-item]
    assert seg.token_ids == [1, 7] and all(type(t) is int for t in seg.token_ids)
    assert all(type(x) is float for x in seg.logprobs)


@pytest.mark.parametrize("logprobs", [None, [], [-0.1], [-0.1, -0.2, -0.3]])
def test_segment_append_sampled_needs_one_logprob_per_token_and_leaves_segment_unchanged(logprobs) -> None:
    seg = Segment([1], [0.0], [0])
    with pytest.raises(ValueError, match="one logprob each"):
        seg.append([2, 3], sampled=True, logprobs=logprobs)
    assert seg == Segment([1], [0.0], [0])


def test_trajectory_token_counts() -> None:
    traj = _nested_trajectory()
    assert traj.num_tokens == 4
    assert traj.num_sampled_tokens == 2


# -- rewards -----------------------------------------------------------------------------------


def test_reward_sums_terms_and_excludes_none() -> None:
    assert Trajectory(rewards={"a": 1.0, "b": None, "c": -0.25}).reward == 0.75
    assert Trajectory(rewards={"a": None}).reward == 0.0
    assert Trajectory().reward == 0.0
    assert isinstance(Trajectory(rewards={"a": 1}).reward, float)  # type: ignore[dict-item]


def test_final_answer_comes_from_info() -> None:
    assert Trajectory().final_answer is None
    assert Trajectory(info={"final_answer": "42"}).final_answer == "42"


def test_finite_mean_skips_none_and_nan() -> None:
    assert finite_mean([1.0, None, float("nan"), 3.0]) == 2.0  # type: ignore[list-item]
    assert finite_mean([]) != finite_mean([])  # nan


def test_trajectory_ids_are_unique() -> None:
    assert len({Trajectory().id for _ in range(100)}) == 100


def test_task_defaults() -> None:
    task = Task("t1", "prompt")
    assert task.answer is None and task.info == {}


# -- schema version ----------------------------------------------------------------------------


def test_newer_schema_version_is_refused_with_an_actionable_message() -> None:
    data = Trajectory(task_id="t").to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError, match="upgrade taskrl") as err:
        Trajectory.from_json(json.dumps(data))
    assert str(SCHEMA_VERSION + 1) in str(err.value)
    assert isinstance(err.value, ValueError)


def test_newer_schema_version_in_a_child_is_refused() -> None:
    data = Trajectory(children=[Trajectory()]).to_dict()
    data["children"][0]["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(SchemaVersionError):
        Trajectory.from_dict(data)


def test_current_and_missing_schema_versions_are_read() -> None:
    data = Trajectory(task_id="t").to_dict()
    assert Trajectory.from_dict(data).schema_version == SCHEMA_VERSION
    del data["schema_version"]
    assert Trajectory.from_dict(data).task_id == "t"


def test_from_dict_does_not_mutate_its_input() -> None:
    data = _nested_trajectory().to_dict()
    snapshot = json.dumps(data)
    Trajectory.from_dict(data)
    assert json.dumps(data) == snapshot


# -- JSONL files -------------------------------------------------------------------------------


def test_write_and_read_jsonl(tmp_path) -> None:
    path = str(tmp_path / "trajs.jsonl")
    first = [_nested_trajectory(), Trajectory(task_id="b")]
    write_jsonl(path, first)
    write_jsonl(path, [Trajectory(task_id="c")])  # appends by default
    got = read_jsonl(path)
    assert [t.task_id for t in got] == ["shop-0-0", "b", "c"]
    assert got[0] == first[0]
    with open(path, encoding="utf-8") as f:
        assert len(f.read().splitlines()) == 3

    write_jsonl(path, [Trajectory(task_id="d")], append=False)
    assert [t.task_id for t in read_jsonl(path)] == ["d"]


def test_read_jsonl_skips_blank_lines(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n" + Trajectory(task_id="x").to_json() + "\n\n   \n", encoding="utf-8")
    assert [t.task_id for t in read_jsonl(str(path))] == ["x"]


def test_read_jsonl_refuses_a_newer_line(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    data = Trajectory().to_dict()
    data["schema_version"] = SCHEMA_VERSION + 5
    path.write_text(Trajectory().to_json() + "\n" + json.dumps(data) + "\n", encoding="utf-8")
    with pytest.raises(SchemaVersionError):
        read_jsonl(str(path))
