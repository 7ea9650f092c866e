"""The search env end to end on real stores: tools, budgets, pruning, the oracle and its foils, the registry."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from taskrl.chat import ChatFormat, format_tool_call
from taskrl.env import acheck_env, make, registry
from taskrl.envs.search.env import (
    SearchEnv,
    SearchEnvConfig,
    aggregate_metrics,
    parse_output_docs,
    prune_view,
)
from taskrl.envs.search.expert import clue_pattern
from taskrl.envs.search.store import CorpusStore
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.types import Message, ToolCall, Trajectory


@pytest.fixture
def env(planted_corpus: CorpusStore) -> SearchEnv:
    env = SearchEnv(corpus=str(planted_corpus.path), per_call_budget=120, context_budget=1000)
    env.reset(env.tasks("train")[0], seed=0)
    return env


def calls(*specs: tuple[str, dict[str, Any]]) -> list[ToolCall]:
    return [ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(specs)]


def chunk_ids(text: str) -> list[str]:
    return re.findall(r'<chunk id="([^"]+)"', text)


async def test_tools_show_each_chunk_once(env: SearchEnv) -> None:
    env.observe_context(100, 4096)
    (doc,), *_ = await env.step(calls(("read_document", {"doc_id": "storm"})))
    assert set(chunk_ids(doc.content)) == {"storm#0", "storm#1"}
    (doc,), *_ = await env.step(calls(("read_document", {"doc_id": "storm"})))
    assert doc.content.startswith("Every chunk of 'storm' was already shown.")
    (first,), *_ = await env.step(calls(("search_corpus", {"query": "lighthouse lamp fuel whalefat"})))
    assert not first.is_error and chunk_ids(first.content)[0] == "lighthouse#0"
    assert first.content.endswith("/1,000]") and "[Token usage: " in first.content
    (again,), *_ = await env.step(calls(("search_corpus", {"query": "lighthouse lamp fuel whalefat"})))
    assert "lighthouse#0" not in chunk_ids(again.content)
    (grep,), *_ = await env.step(calls(("grep_corpus", {"pattern": "whale|ox(blood)"})))
    assert chunk_ids(grep.content) == ["ledger#0"]  # lighthouse#0 also matches but was already shown
    assert len(env.seen) == len(set(env.seen))


async def test_parallel_calls_in_one_turn_never_show_a_chunk_twice(env: SearchEnv) -> None:
    results, *_ = await env.step(calls(*[("search_corpus", {"query": "council harbor lighthouse"})] * 4))
    shown = [i for r in results for i in chunk_ids(r.content)]
    assert len(shown) == len(set(shown)) > 0


async def test_a_turns_calls_show_what_the_same_calls_in_one_call_turns_would(planted_corpus: CorpusStore) -> None:
    """Calls of one turn run in call order: each excludes what the calls before it showed and sizes its result to
    the room they left, so no call loses its next-best chunks to a race (thread timing once cost the oracle a
    document in a full `make test`)."""
    specs = [("search_corpus", {"query": "council harbor lighthouse"})] * 3 + [("grep_corpus", {"pattern": "storm"})]

    def fresh() -> SearchEnv:
        env = SearchEnv(corpus=str(planted_corpus.path), per_call_budget=120, context_budget=1000)
        env.reset(env.tasks("train")[0], seed=0)
        env.observe_context(700, 4096)  # 200 tokens of room before the hard limit: the calls compete for it
        return env

    one_turn = fresh()
    together, *_ = await one_turn.step(calls(*specs))
    apart = fresh()
    alone = []
    for spec in specs:  # as one turn counts its calls' claims against the room: the chunks shown so far
        apart.observe_context(700 + sum(apart.seen.values()), 4096)
        alone.append((await apart.step(calls(spec)))[0][0])
    assert [chunk_ids(r.content) for r in together] == [chunk_ids(r.content) for r in alone]
    assert len(chunk_ids(together[1].content)) > 0  # the second search found the next chunks, not an empty result


async def test_bad_calls_become_error_results(env: SearchEnv) -> None:
    bad_regex, bad_doc, bad_prune = (
        await env.step(
            calls(
                ("grep_corpus", {"pattern": "(unclosed"}),
                ("read_document", {"doc_id": "atlantis"}),
                ("prune_chunks", {"chunk_ids": ["harbor#0", "nope#9"]}),
            )
        )
    )[0]
    assert bad_regex.is_error and "invalid regular expression '(unclosed'" in bad_regex.content
    assert bad_doc.is_error and "no document 'atlantis'" in bad_doc.content
    assert bad_prune.is_error and "unknown chunk ids: harbor#0, nope#9" in bad_prune.content
    assert "nothing was pruned" in bad_prune.content and env.pruned == set()


async def test_a_prune_of_100k_unknown_ids_gets_a_short_error(env: SearchEnv) -> None:
    ids = [f"no-such-doc-{i}#0" for i in range(100_000)]
    (result,), *_ = await env.step(calls(("prune_chunks", {"chunk_ids": ids})))
    assert result.is_error and "no-such-doc-0#0" in result.content and "and 99,980 more" in result.content
    assert len(result.content) < 3000 and env.pruned == set()


async def test_prune_replaces_chunks_in_the_view_but_keeps_them_in_the_record(env: SearchEnv) -> None:
    (found,), *_ = await env.step(calls(("search_corpus", {"query": "whalefat lamp"})))
    ids = chunk_ids(found.content)
    view = [Message("user", "q"), Message("tool", found.content, tool_call_id="call_0")]
    (pruned,), terminated, truncated, info = await env.step(calls(("prune_chunks", {"chunk_ids": ids[:1]})))
    assert not pruned.is_error and pruned.content.startswith("Pruned 1 chunks")
    new_view = info["context"](view)
    assert f'<chunk id="{ids[0]}" doc="lighthouse" pruned="true"/>' in new_view[1].content
    assert "whalefat" not in new_view[1].content and new_view[0].content == "q"
    assert view[1].content == found.content  # the caller's messages (the trajectory) are untouched
    assert all(i in new_view[1].content for i in ids[1:])
    assert env.pruned == {ids[0]} and ids[0] in env.seen
    (twice,), *_ = await env.step(calls(("prune_chunks", {"chunk_ids": ids[:1]})))
    assert "Pruned 0 chunks" in twice.content and "(1 were already pruned)" in twice.content


def test_prune_view_leaves_other_messages_alone() -> None:
    text = '<chunk id="a#0" doc="a" tokens="3">\nkeep me\n</chunk>\n<chunk id="b#1" doc="b" tokens="3">\ndrop\n</chunk>'
    out = prune_view([Message("tool", text), Message("assistant", text)], frozenset({"b#1"}))
    assert (
        out[0].content
        == '<chunk id="a#0" doc="a" tokens="3">\nkeep me\n</chunk>\n<chunk id="b#1" doc="b" pruned="true"/>'
    )
    assert out[1].content == text


async def test_soft_threshold_note_only_in_training(env: SearchEnv) -> None:
    env.observe_context(600, 4096)  # T = 1000 (configured), soft at 500
    *_, info = await env.step(calls(("search_corpus", {"query": "granite seawall"})))
    assert "prune" in info["append_messages"][0].content and info["append_messages"][0].role == "user"
    *_, info = await env.step(calls(("search_corpus", {"query": "iron nails"})))
    assert "append_messages" not in info  # once per crossing
    env.reset(env.tasks()[0])
    env.training = False
    env.observe_context(600, 4096)
    *_, info = await env.step(calls(("search_corpus", {"query": "granite seawall"})))
    assert "append_messages" not in info


async def test_hard_limit_refuses_every_tool_but_prune(env: SearchEnv) -> None:
    (found,), *_ = await env.step(calls(("search_corpus", {"query": "warden keys"})))
    env.observe_context(950, 4096)  # hard limit at 0.9 * 1000
    results, *_ = await env.step(
        calls(
            ("search_corpus", {"query": "x"}),
            ("grep_corpus", {"pattern": "x"}),
            ("read_document", {"doc_id": "storm"}),
            ("prune_chunks", {"chunk_ids": chunk_ids(found.content)}),
        )
    )
    assert [r.is_error for r in results] == [True, True, True, False]
    assert "Only prune_chunks works now" in results[0].content and "950 of 1,000" in results[0].content
    env.observe_context(300, 4096)
    (ok,), *_ = await env.step(calls(("search_corpus", {"query": "x"})))
    assert not ok.is_error


async def test_results_shrink_to_the_room_left_before_the_hard_limit(env: SearchEnv) -> None:
    env.observe_context(840, 4096)  # 60 tokens left before the hard limit of 900; per-call budget is 120
    results, *_ = await env.step(calls(*[("search_corpus", {"query": q}) for q in ("council", "market", "storm")]))
    shown = [i for r in results for i in chunk_ids(r.content)]
    assert shown and sum(env.seen[i] for i in shown) <= 60  # parallel calls share the room


def test_parse_output_docs() -> None:
    assert parse_output_docs("ANSWER: oxblood\nDOCUMENTS: harbor, archive#0, `ledger`, harbor") == (
        "harbor",
        "archive",
        "ledger",
    )
    assert parse_output_docs("documents: a b;c") == ("a", "b", "c")
    assert parse_output_docs("no list") == () and parse_output_docs(None) == ()


def test_clue_pattern_matches_raw_pydoc_text() -> None:
    pattern = clue_pattern("Serialize ``obj`` to a [X1] formatted str.")
    match = pattern.search("     |  Serialize ``obj`` to a JSON\n     |  formatted str.")
    assert match and match.group(1) == "JSON"


def _run(store: CorpusStore, rule: Any, **config: Any) -> list[Trajectory]:
    factory = lambda: SearchEnv(corpus=str(store.path), **config)  # noqa: E731
    tasks = factory().tasks("train") + factory().tasks("test")
    return asyncio.run(run_episodes(factory, ScriptedPolicy(rule), tasks, RolloutConfig(max_turns=6)))


def _prune_everything(messages: list[Message], tools: Any) -> str:
    turns = sum(m.role == "assistant" for m in messages)
    if turns == 0:
        return SearchEnv.scripted_rule(messages, tools)
    if turns == 1:
        shown = [i for m in messages if m.role == "tool" for i in chunk_ids(m.content)]
        return format_tool_call("prune_chunks", {"chunk_ids": shown})
    return SearchEnv.scripted_rule(messages, tools)  # answers from what is left in view: nothing


def test_oracle_reaches_full_recall_and_the_foils_score_below(planted_corpus: CorpusStore) -> None:
    oracle = _run(planted_corpus, SearchEnv.scripted_rule)
    assert len(oracle) == 12 and all(t.error is None and t.terminated for t in oracle)
    summary = aggregate_metrics(oracle)
    assert summary["search/output_recall"] == 1.0 and summary["search/trajectory_recall"] == 1.0
    assert summary["search/answer_found"] == 1.0
    assert all(t.reward == pytest.approx(2.0) for t in oracle)
    assert all(t.info["final_answer"].startswith(f"ANSWER: {t.info['output_doc_ids'] and ''}") for t in oracle)

    pruner = _run(planted_corpus, _prune_everything)
    assert all(t.info["pruned_chunk_ids"] for t in pruner)
    assert aggregate_metrics(pruner)["search/output_recall"] == 0.0
    assert aggregate_metrics(pruner)["search/trajectory_recall"] == 1.0  # pruned chunks keep their credit
    assert all(p.reward < o.reward for p, o in zip(pruner, oracle, strict=True))
    assert all(p.reward == pytest.approx(1.3) for p in pruner)

    silent = _run(planted_corpus, lambda m, t: "ANSWER: I do not know\nDOCUMENTS:")
    assert all(t.reward == pytest.approx(0.01) for t in silent)  # the floor ε


def test_search_only_expert_calls_no_grep_and_still_reaches_full_recall(planted_corpus: CorpusStore) -> None:
    env = SearchEnv(corpus=str(planted_corpus.path), expert_grep=False)
    oracle = _run(planted_corpus, env.scripted_rule)
    calls = [c.name for t in oracle for m in t.messages if m.role == "assistant" for c in m.tool_calls]
    assert calls and "grep_corpus" not in calls and "search_corpus" in calls
    assert aggregate_metrics(oracle)["search/output_recall"] == 1.0
    assert "grep_corpus" in SearchEnv(corpus=str(planted_corpus.path)).scripted_rule(oracle[0].messages[:2], None)


def test_pruning_opens_a_new_segment_in_token_mode(planted_corpus: CorpusStore) -> None:
    fmt = ChatFormat(smollm2_tokenizer())
    factory = lambda: SearchEnv(corpus=str(planted_corpus.path))  # noqa: E731
    task = factory().tasks("train")[0]
    (traj,) = asyncio.run(
        run_episodes(factory, ScriptedPolicy(_prune_everything, chat_format=fmt), [task], RolloutConfig(max_turns=4))
    )
    assert traj.error is None and traj.terminated
    assert traj.metrics["segments"] == 2 and traj.metrics["context_resets"] == 1
    assert any("pruned=" not in m.content and "<chunk" in m.content for m in traj.messages if m.role == "tool")
    assert 0 < traj.metrics["search/context_utilisation"] < 1


async def test_planted_env_passes_check_env(planted_corpus: CorpusStore) -> None:
    await acheck_env(SearchEnv(corpus=str(planted_corpus.path)))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hard_fraction": 0.4}, "SearchEnvConfig.hard_fraction"),
        ({"soft_fraction": 0.95, "hard_fraction": 0.9}, "SearchEnvConfig.soft_fraction"),
        ({"per_call_budget": 4}, "SearchEnvConfig.per_call_budget"),
        ({"context_budget": 10}, "SearchEnvConfig.context_budget"),
    ],
)
def test_bad_config_names_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SearchEnvConfig(**kwargs)
    assert SearchEnvConfig.seed_preset().soft_fraction == 0.9


def test_missing_tasks_name_the_command(planted_corpus: CorpusStore, tmp_path: Any) -> None:
    with pytest.raises(FileNotFoundError, match="taskrl datagen multihop --corpus"):
        SearchEnv(corpus=str(planted_corpus.path), tasks=str(tmp_path / "none.jsonl"))


def test_default_env_is_registered_and_the_oracle_solves_its_tasks() -> None:
    assert "search" in registry()
    env = make("search")
    tasks = list(env.tasks("train"))[:4] + list(env.tasks("test"))[:2]
    assert {t.info["difficulty"] for t in env.tasks("train")} == {1, 2, 3}
    trajectories = asyncio.run(
        run_episodes(lambda: make("search"), ScriptedPolicy(SearchEnv.scripted_rule), tasks, RolloutConfig(max_turns=4))
    )
    # Once below 1.0 (0.944) in a full `make test` (parallel calls of one turn raced for the same chunks and the
    # budget; they now run in call order): should it happen again, say which task and what its episode saw.
    missed = {t.task_id: [(m.role, m.content[:300]) for m in t.messages[2:]] for t in trajectories
              if t.metrics.get("search/output_recall") != 1.0}  # fmt: skip
    assert aggregate_metrics(trajectories)["search/output_recall"] == 1.0, missed


SLOW_FUZZY = r"(?:the (?:\w+ ){0,6}quillstamp archive warden ledger){e<=3}"  # ~0.1 s per chunk
_TIMED_OUT_GREP = """
import asyncio, dataclasses, sys, threading
from taskrl.envs.search.env import SearchEnv
from taskrl.types import ToolCall
env = SearchEnv(corpus=sys.argv[1], grep_budget_s=600)
env.reset(env.tasks("train")[0])
grep = dataclasses.replace(env.tools["grep_corpus"], timeout_s=0.3)  # the agent loop's tool timeout
before = set(threading.enumerate())
result = asyncio.run(grep(ToolCall("c", "grep_corpus", {"pattern": sys.argv[2]})))
print(result.content.splitlines()[0])
started = [t for t in threading.enumerate() if t not in before]
for thread in started:
    thread.join(30)  # generous: a loaded machine is slow, but the scan must end at all
print("alive:", [t.name for t in started if t.is_alive()])
"""


def test_timed_out_grep_stops_scanning_and_the_process_exits(planted_corpus: CorpusStore) -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _TIMED_OUT_GREP, str(planted_corpus.path), SLOW_FUZZY],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    first, alive = run.stdout.strip().splitlines()[-2:]
    assert first.startswith("Tool 'grep_corpus' timed out after 0.3s"), run.stdout
    assert alive == "alive: []"  # the scanning thread ended with its call; the process then exits
