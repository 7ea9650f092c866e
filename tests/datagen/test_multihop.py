"""Multi-hop task generation: every kept task verifies; bad quotes and answer-bearing distractors are rejected."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from taskrl.cli import app
from taskrl.datagen.bridges import BridgeIndex
from taskrl.datagen.multihop import (
    ExtractiveGenerator,
    Fact,
    GenerationConfig,
    GenerationReport,
    LLMGenerator,
    mask_term,
    normalize,
    verify_fact,
    verify_task,
)
from taskrl.envs.search.corpus import Document
from taskrl.envs.search.embed import HASHING
from taskrl.envs.search.store import CorpusStore
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.types import Message, read_tasks, write_tasks

DOCS = {
    "orchard": "The orchard grows pears and plums on the south slope. Each tree is pruned with a fennick blade "
    "in late winter. Its fruit is sold at the fair every autumn.",
    "fair": "The fair fills the meadow for three days in autumn. Cider is pressed in a cask of ashwood for the "
    "visitors. Prizes for the best fruit are judged by the mill owner.",
    "mill": "The mill grinds grain with a wheel turned by the river. The miller keeps the flour in a loft "
    "above the stream. Every sack is stamped with a crimson seal.",
    "river": "The river floods the meadow each spring and feeds the mill. Herons nest in the reeds along its "
    "banks. A ferryman named Oswin crosses it at the narrows.",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    store = CorpusStore(tmp_path_factory.mktemp("dg") / "corpus", create=True, embedder=HASHING, chunk_tokens=24)
    store.ingest(Document(k, v, k) for k, v in DOCS.items())
    return store


def generate(store: CorpusStore, **kw: Any) -> tuple[list, GenerationReport]:
    return ExtractiveGenerator(store, GenerationConfig(**{"n": 6, "max_answer_df": 1, **kw})).generate()


def test_generated_tasks_verify_and_cover_every_difficulty(store: CorpusStore) -> None:
    tasks, report = generate(store)
    assert report.kept == len(tasks) == 6
    assert [t.info["difficulty"] for t in tasks] == [1, 2, 3, 1, 2, 3]
    for task in tasks:
        assert verify_task(task, store) == []
        facts = task.info["facts"]
        assert len(facts) == task.info["difficulty"]
        for fact in facts:
            assert fact["chunk_ids"] and all(normalize(fact["quote"]) in normalize(c.text)
                                             for c in store.chunks(fact["chunk_ids"]).values())  # fmt: skip
        for earlier, later in zip(facts, facts[1:], strict=False):
            assert earlier["term"] == later["doc_id"]  # each masked term names the next hop's document
        answer = task.info["answer"]
        assert answer == facts[-1]["term"] and answer.lower() not in task.prompt.lower()
        assert task.answer.startswith(f"ANSWER: {answer}\nDOCUMENTS: ")
        assert set(task.info["answer_chunk_ids"]) == set(facts[-1]["chunk_ids"])
    assert generate(store)[0] == tasks  # deterministic for a seed
    assert generate(store, seed=1)[0] != tasks


def test_a_quote_that_is_not_in_the_document_is_rejected(store: CorpusStore) -> None:
    fake = Fact("orchard", "Each tree is pruned with a golden blade in late winter.", "golden")
    assert verify_fact(fake, store) == "quote_not_in_document"
    elsewhere = Fact("mill", "Each tree is pruned with a fennick blade in late winter.", "fennick")
    assert verify_fact(elsewhere, store) == "quote_not_in_document"  # real text, wrong document
    assert verify_fact(Fact("orchard", "Its fruit is sold at the fair every autumn.", "ferryman"), store) == (
        "term_not_in_quote"
    )
    good = Fact("orchard", "Each tree is pruned with a fennick blade in late winter.", "fennick")
    assert verify_fact(good, store) is None and good.chunk_ids

    task = generate(store)[0][0]
    broken = copy.deepcopy(task)
    broken.info["facts"][0]["quote"] = "A sentence that no document contains at all."
    assert "fact_0_quote_not_in_chunk" in verify_task(broken, store)


def test_a_distractor_that_contains_the_answer_is_rejected(store: CorpusStore) -> None:
    task = generate(store)[0][0]
    answer = task.info["answer"]
    holder = next(c for c in store.iter_chunks() if answer.lower() in c.text.lower())
    poisoned = copy.deepcopy(task)
    poisoned.info["distractor_chunk_ids"] = [holder.id]
    assert "distractor_contains_answer" in verify_task(poisoned, store)
    leaked = copy.deepcopy(task)
    leaked.prompt += f" (hint: {answer})"
    assert "answer_in_question" in verify_task(leaked, store)
    # The generator checks its distractors the same way, counting and dropping those holding the answer.
    tasks, report = generate(store, n=12, distractors=3)
    for t in tasks:
        for chunk in store.chunks(t.info["distractor_chunk_ids"]).values():
            assert t.info["answer"].lower() not in chunk.text.lower()
    assert set(report.dropped) <= {"no_answer_term", "no_bridge", "duplicate", "distractor_contains_answer"}


def test_mask_and_tasks_round_trip(store: CorpusStore, tmp_path: Path) -> None:
    assert mask_term("The Mill and the mill-race", "mill", 2) == "The [X2] and the [X2]-race"
    tasks, _ = generate(store)
    path = write_tasks(tasks, tmp_path / "t.jsonl")
    assert read_tasks(path) == tasks
    path.write_text("{bad\n")
    with pytest.raises(ValueError, match=r"t.jsonl:1: not a task row"):
        read_tasks(path)


def test_generation_config_is_validated() -> None:
    with pytest.raises(ValueError, match="GenerationConfig.hops"):
        GenerationConfig(hops=(4,))
    with pytest.raises(ValueError, match="GenerationConfig.n"):
        GenerationConfig(n=0)


def _llm(honest: bool) -> ScriptedPolicy:
    """A policy that answers the generator's prompt: with a real sentence of the passage, or an invented one."""

    def rule(messages: list[Message], tools: Any) -> str:
        passage = messages[-1].content
        sentence = re.split(r"(?<=\.)\s+", normalize(passage))[0] if honest else "The moon is made of cheese."
        answer = max(re.findall(r"[A-Za-z]{5,}", sentence), key=len)
        return json.dumps({"question": "Which word is hidden here?", "answer": answer, "quote": sentence})

    return ScriptedPolicy(rule)


def test_llm_generator_keeps_verified_proposals_and_drops_invented_quotes(store: CorpusStore) -> None:
    config = GenerationConfig(n=3, hops=(1,), max_attempts=20)
    tasks, report = asyncio.run(LLMGenerator(store, _llm(honest=True), config).agenerate())
    assert report.kept == 3 and all(verify_task(t, store) == [] for t in tasks)
    assert all(t.info["generator"] == "llm" and "Which word is hidden here?" in t.prompt for t in tasks)
    tasks, report = asyncio.run(
        LLMGenerator(store, _llm(honest=False), GenerationConfig(n=2, max_attempts=3)).agenerate()
    )
    assert tasks == [] and report.dropped["quote_not_in_document"] == 6


def test_datagen_cli(store: CorpusStore, tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"
    result = CliRunner().invoke(
        app, ["datagen", "multihop", "--corpus", str(store.path), "--n", "4", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "kept 4/4 tasks" in result.output and len(read_tasks(out)) == 4
    result = CliRunner().invoke(app, ["datagen", "multihop", "--corpus", str(store.path), "--hops", "x"])
    assert result.exit_code != 0


# -- namespaced, hyphenated ids (package metadata style) -------------------------------------------------------
sys.path.insert(0, str(Path(__file__).parents[1] / "envs" / "search"))
from search_planted import write_namespaced  # noqa: E402


@pytest.fixture(scope="module")
def namespaced(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    from taskrl.envs.search.build import build_corpus

    root = tmp_path_factory.mktemp("ns")
    store, _ = build_corpus(write_namespaced(root / "src"), root / "corpus", embedder=HASHING, chunk_tokens=64)
    return store


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_namespaced_hyphenated_ids_keep_at_least_90_percent_of_the_tasks(namespaced: CorpusStore, hops: int) -> None:
    assert any(d.endswith("++-12") for d in namespaced.document_ids())  # ids kept as written, '+' included
    tasks, report = ExtractiveGenerator(namespaced, GenerationConfig(n=20, hops=(hops,), seed=hops)).generate()
    assert report.kept >= 18, report.to_dict()
    assert all(verify_task(t, namespaced) == [] and t.info["difficulty"] == hops for t in tasks)
    for task in tasks:
        for earlier, later in zip(task.info["facts"], task.info["facts"][1:], strict=False):
            assert earlier["term"] == later["doc_id"]
            assert re.search(r"[:+\-]", later["doc_id"])  # bridged through a namespaced / hyphenated id
    assert report.to_dict()["id_normalisation"] == "casefold" and report.bridge_sources > 0


def test_bridges_are_whole_id_tokens(namespaced: CorpusStore) -> None:
    index = BridgeIndex(namespaced.document_ids())
    assert index.mentioned("Its successor lib:a-b-c keeps the interface.") == {"lib:a-b-c"}
    assert index.mentioned("See lib:a-b. Also LIB:A-B-C, and (lib:a-b)") == {"lib:a-b", "lib:a-b-c"}
    assert index.mentioned("lib:a-bc and xlib:a-b and lib:a-b-c-d") == set()
    assert index.mask("See lib:a-b, not lib:a-b-c.", "lib:a-b", 1) == "See [X1], not lib:a-b-c."
    mentions = ExtractiveGenerator(namespaced, GenerationConfig(n=4)).index.mentions
    # lib:a-b names lib:a-b-c twice; a prefix match would also count those sentences as mentions of lib:a-b.
    assert "lib:a-b" in {source for source, _ in mentions["lib:a-b-c"]}
    assert all(BridgeIndex(["lib:a-b"]).mentioned(sentence) for _, sentence in mentions["lib:a-b"])


def test_id_normalisation_is_configurable_and_reported() -> None:
    ids = ["Foo_Bar", "foo-bar", "pkg:Name.Part"]
    assert BridgeIndex(ids, "exact").mentioned("uses Foo_Bar and foo-bar") == {"Foo_Bar", "foo-bar"}
    assert BridgeIndex(ids, "exact").mentioned("uses pkg:name.part") == set()
    assert BridgeIndex(ids, "casefold").mentioned("uses PKG:name.part") == {"pkg:Name.Part"}
    loose = BridgeIndex(ids, "separators")
    assert loose.ambiguous == ["foo-bar"]  # Foo_Bar and foo-bar collide: neither bridges
    assert loose.mentioned("uses foo.bar and pkg:name-part") == {"pkg:Name.Part"}
    with pytest.raises(ValueError, match="GenerationConfig.id_normalisation"):
        GenerationConfig(id_normalisation="fuzzy")


def test_datagen_cli_fails_when_nothing_is_kept_and_warns_when_fewer(namespaced: CorpusStore, tmp_path: Path) -> None:
    from taskrl.datagen.multihop import TooFewTasksError

    lonely = CorpusStore(tmp_path / "one", create=True, embedder=HASHING, chunk_tokens=24)
    lonely.ingest([Document("pkg:only-one", DOCS["orchard"])])  # no other document: no bridge to chain
    out = tmp_path / "tasks.jsonl"
    nothing = CliRunner().invoke(app, ["datagen", "multihop", "--corpus", str(lonely.path), "--hops", "2", "--n", "3",
                                       "--out", str(out)])  # fmt: skip
    assert isinstance(nothing.exception, TooFewTasksError) and "kept 0 of 3 tasks, nothing written" in str(
        nothing.exception
    )
    assert "no_bridge" in str(nothing.exception) and not out.exists()  # never an empty file with exit 0
    args = ["datagen", "multihop", "--corpus", str(namespaced.path), "--out", str(out)]
    strict = CliRunner().invoke(app, [*args, "--n", "500", "--hops", "3", "--strict"])
    assert isinstance(strict.exception, TooFewTasksError) and not out.exists()
    few = CliRunner().invoke(app, [*args, "--n", "500", "--hops", "1", "--id-normalisation", "exact",
                                   "--min-yield", "0"])  # fmt: skip
    assert few.exit_code == 0 and "warning: only" in " ".join(few.output.split()), few.output
    assert 0 < len(read_tasks(out)) < 500


# -- namespaced ids named by their bare names in the text (issue 37) -------------------------------------------
DEB = {
    "deb:libzorb3": "The libzorb3 library decodes quirnel streams for the desktop. It links against libplinth at "
    "start. Its manual page is written by the vantrel team.",
    "deb:libplinth": "The libplinth package ships the shared plinth runtime. Every release is built with "
    "gravlock on the build farm. It was split from zorbtools years ago.",
    "deb:zorbtools": "The zorbtools suite bundles command line helpers for libzorb3 users. Packagers sign it "
    "with a mordane key each month. Old helpers moved into libplinth after the split.",
    "deb:gravlock": "The gravlock compiler turns plinth sources into bytecode. It keeps a cache in a "
    "fennel directory under the home folder. Maintainers of zorbtools rely on it daily.",
}


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> CorpusStore:
    store = CorpusStore(tmp_path_factory.mktemp("deb") / "corpus", create=True, embedder=HASHING, chunk_tokens=32)
    store.ingest(Document(k, v, k) for k, v in DEB.items())
    return store


def test_namespaced_ids_bridge_to_their_bare_mentions_by_the_alias_rule(deb: CorpusStore) -> None:
    index = BridgeIndex(deb.document_ids(), alias="prefix")
    assert index.mentioned("It links against libplinth at start.") == {"deb:libplinth"}
    assert index.mentioned("It links against deb:libplinth, not libplinthx.") == {"deb:libplinth"}
    assert index.mask("links against libplinth at start", "deb:libplinth", 1) == "links against [X1] at start"
    assert BridgeIndex(deb.document_ids()).mentioned("links against libplinth") == set()  # without a rule
    custom = BridgeIndex(["pypi/requests", "deb:requests"], alias=r"pypi/(.+)")  # a user rule, one group
    assert custom.mentioned("uses requests") == {"pypi/requests"}
    clash = BridgeIndex(["deb:foo", "rpm:foo", "foo-bar", "pkg:foo-bar"], alias="prefix")
    assert clash.mentioned("foo and foo-bar") == {"foo-bar"}  # foo is ambiguous; a real id beats an alias
    assert clash.ambiguous == ["foo"]
    with pytest.raises(ValueError, match="GenerationConfig.id_alias.*one group"):
        GenerationConfig(id_alias=r"deb:.+")
    with pytest.raises(ValueError, match="GenerationConfig.id_alias"):
        GenerationConfig(id_alias="(")

    none, report = ExtractiveGenerator(deb, GenerationConfig(n=6, hops=(2,), id_alias="none")).generate()
    assert report.bridge_sources == 0 and none == []  # the 0 bridge sentences
    tasks, report = ExtractiveGenerator(deb, GenerationConfig(n=6, hops=(2,), max_answer_df=1)).generate()
    assert report.id_alias == "prefix" and report.aliased_ids == 4 and report.bridge_sources > 0
    assert len(tasks) == 6, report.to_dict()
    for task in tasks:
        assert verify_task(task, deb) == []
        first, second = task.info["facts"]
        assert first["term"] == second["doc_id"] and second["doc_id"].startswith("deb:")
        bare = second["doc_id"].removeprefix("deb:")
        assert bare in first["quote"] and not re.search(rf"(?<![\w:]){re.escape(bare)}(?![\w])", task.prompt)


def test_datagen_cli_exits_non_zero_with_the_reason_when_the_yield_is_far_below_n(deb: CorpusStore,
                                                                                 tmp_path: Path) -> None:  # fmt: skip
    from taskrl.datagen.multihop import DEFAULT_MIN_YIELD, TooFewTasksError

    out = tmp_path / "tasks.jsonl"
    args = ["datagen", "multihop", "--corpus", str(deb.path), "--out", str(out), "--hops", "2"]
    low = CliRunner().invoke(app, [*args, "--n", "32", "--id-alias", "none"])
    assert isinstance(low.exception, TooFewTasksError) and not out.exists()
    message = str(low.exception)
    assert "kept 0 of 32 tasks, nothing written" in message and "no sentence names another document" in message
    assert "--id-alias" in message
    enough = CliRunner().invoke(app, [*args, "--n", "4"])  # the default alias rule bridges them
    assert enough.exit_code == 0 and len(read_tasks(out)) == 4, enough.output
    out.unlink()
    far = CliRunner().invoke(app, [*args, "--n", "400"])  # a few dozen distinct tasks exist; 400 is far above
    assert isinstance(far.exception, TooFewTasksError) and f"--min-yield {DEFAULT_MIN_YIELD:g}" in str(far.exception)
    assert not out.exists()
    lenient = CliRunner().invoke(app, [*args, "--n", "400", "--min-yield", "0"])
    assert lenient.exit_code == 0 and "warning: only" in " ".join(lenient.output.split()), lenient.output
    bad = CliRunner().invoke(app, [*args, "--min-yield", "2"])
    assert "--min-yield" in str(bad.exception)
