"""`taskrl corpus build|info|search|metrics` and `taskrl rollout --env search` through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from search_planted import write_planted
from typer.testing import CliRunner

import taskrl.env as env_module
from taskrl.cli import app
from taskrl.env import make, register, registry
from taskrl.envs.search.env import SearchEnv
from taskrl.envs.search.store import CorpusStore


def test_corpus_build_is_idempotent_and_inspectable(tmp_path: Path) -> None:
    source = write_planted(tmp_path / "src")
    out = tmp_path / "corpus"
    args = ["corpus", "build", str(source), "--out", str(out), "--embedder", "hashing-384", "--chunk-tokens", "48"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "8 documents added" in first.output and "0 unchanged" in first.output
    again = CliRunner().invoke(app, args)
    text = " ".join(again.output.split())  # the console wraps long lines
    assert again.exit_code == 0 and "0 documents added, 0 replaced, 8 unchanged; 0 chunks added" in text
    assert f"holds 8 documents, {CorpusStore(out).count()} chunks" in text

    info = CliRunner().invoke(app, ["corpus", "info", str(out)])
    assert info.exit_code == 0 and "hashing-384" in info.output
    found = CliRunner().invoke(app, ["corpus", "search", str(out), "oxblood ink", "--budget", "100"])
    assert found.exit_code == 0 and "ledger#0" in found.output
    missing = CliRunner().invoke(app, ["corpus", "info", str(tmp_path / "nothing")])
    assert missing.exit_code != 0 and "no corpus at" in str(missing.exception)


def test_corpus_build_fails_cleanly_and_never_leaves_a_partial_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.bin").write_bytes(b"\x00")
    (src / "table.csv").write_text("a,b\n")
    out = tmp_path / "corpus"
    args = ["corpus", "build", str(src), "--out", str(out), "--embedder", "hashing-384"]
    empty = CliRunner().invoke(app, args)
    assert empty.exit_code != 0 and "no documents in" in str(empty.exception)
    assert "skipped unsupported files: data.bin, table.csv" in str(empty.exception)
    assert not out.exists()  # nothing written for a source that fails
    good = [{"id": f"pkg:doc-{i}", "text": f"Text {i}."} for i in range(3)]
    (src / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good) + "{broken\n")
    broken = CliRunner().invoke(app, args)
    assert broken.exit_code != 0 and "docs.jsonl:4: not valid JSON" in str(broken.exception)
    assert not out.exists()  # the bad last line is found before the first document is written
    (src / "docs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    built = CliRunner().invoke(app, args)
    assert built.exit_code == 0, built.output
    text = " ".join(built.output.split())
    assert "read 3 documents (.jsonl: 3); skipped 2 unsupported files (data.bin, table.csv)" in text
    assert CorpusStore(out).document_ids() == ["pkg:doc-0", "pkg:doc-1", "pkg:doc-2"]


def test_an_unfinished_build_is_refused_by_readers_and_resumed_by_builders(tmp_path: Path) -> None:
    from taskrl.envs.search.build import build_corpus
    from taskrl.envs.search.store import CorpusStoreError

    source = write_planted(tmp_path / "src")
    store = CorpusStore(tmp_path / "corpus", create=True, embedder="hashing-384", chunk_tokens=48)
    store.set_building(True)  # what a build that crashed half-way leaves
    with pytest.raises(CorpusStoreError, match="unfinished build.*rerun `taskrl corpus build"):
        CorpusStore(tmp_path / "corpus")
    build_corpus(source, tmp_path / "corpus", embedder="hashing-384", chunk_tokens=48)
    assert len(CorpusStore(tmp_path / "corpus").document_ids()) == 8


def test_rollout_cli_with_the_oracle_and_metrics(
    planted_corpus: CorpusStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI plays a registered env by name: register the planted corpus under a test name.
    monkeypatch.setattr(env_module, "_REGISTRY", dict(registry()))
    register("search-planted", lambda: SearchEnv(corpus=str(planted_corpus.path)))
    assert make("search-planted").name == "search"
    out = tmp_path / "runs.jsonl"
    result = CliRunner().invoke(
        app, ["rollout", "--env", "search-planted", "--policy", "scripted", "--n", "3", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["metrics"]["search/output_recall"] == 1.0 for r in rows)
    metrics = CliRunner().invoke(app, ["corpus", "metrics", str(out)])
    assert metrics.exit_code == 0 and "search/output_recall" in metrics.output and "1.000" in metrics.output
