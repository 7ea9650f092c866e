"""The interaction store on a real SQLite file and a real PostgreSQL server: group commit, isolation of bad rows,
tenant filters, crash safety (``store_url`` in conftest.py starts the database)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taskrl.deploy.store import Decision, Feedback, Interaction, InteractionStore, StoreError


def interaction(i: int, tenant: str = "a", version: int = 0) -> Interaction:
    return Interaction(
        tenant=tenant,
        session_id=f"s{i % 3}",
        model="m",
        policy_version=version,
        request={"messages": [{"role": "user", "content": f"q{i}"}]},
        response={"message": {"role": "assistant", "content": f"a{i}"}, "finish_reason": "stop"},
        completion_token_ids=[i, i + 1],
        logprobs=[-0.5, -0.25],
        prompt_token_ids=[1, 2, 3],
        id=f"int_{i}",
    )


async def test_concurrent_writes_are_all_committed_once(store_url: str) -> None:
    with InteractionStore(store_url) as store:
        await asyncio.gather(*(store.add("interactions", interaction(i)) for i in range(300)))
        assert store.count() == 300
        rows = store.interactions()
        assert sorted(r.id for r in rows) == sorted(f"int_{i}" for i in range(300))
        assert rows[0].completion_token_ids == [0, 1] and rows[0].logprobs == [-0.5, -0.25]
        assert store.engine.dialect.name == store_url.split(":")[0].split("+")[0]
        if store.engine.dialect.name == "sqlite":
            with store.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


async def test_a_bad_row_fails_alone(store_url: str) -> None:
    with InteractionStore(store_url) as store:
        await store.add("interactions", interaction(1))
        results = await asyncio.gather(
            store.add("interactions", interaction(1)),  # duplicate id
            store.add("feedback", Feedback("int_missing", "a", "accepted")),  # dangling foreign key
            store.add("interactions", interaction(2)),
            store.add("feedback", Feedback("int_1", "a", "accepted")),
            return_exceptions=True,
        )
        assert isinstance(results[0], StoreError) and isinstance(results[1], StoreError)
        assert results[2] == "committed" and results[3] == "committed"
        assert store.count() == 2 and store.count("feedback") == 1


def test_reads_filter_by_tenant_version_and_session(store_url: str) -> None:
    with InteractionStore(store_url) as store:
        for i in range(6):
            store.add_sync("interactions", interaction(i, tenant="a" if i < 4 else "b", version=i % 2))
        store.add_sync("decisions", Decision("m", "promote", 0, 1, {"ci": [0.1, 0.2]}))
        assert len(store.interactions(tenant="a")) == 4 and len(store.interactions(tenant="b")) == 2
        assert store.get_interaction("int_5", tenant="a") is None
        assert store.get_interaction("int_5", tenant="b") is not None
        assert {r.policy_version for r in store.interactions(min_version=1)} == {1}
        assert {r.session_id for r in store.interactions(session_id="s1")} == {"s1"}
        assert store.max_version() == 1
        assert store.decisions()[0].evidence == {"ci": [0.1, 0.2]}


def test_bad_url_names_the_fix() -> None:
    with pytest.raises(StoreError, match="sqlite:///"):
        InteractionStore("interactions.db")


WRITER = """
import sys
from taskrl.deploy.store import InteractionStore
from tests_store_helper import interaction
store = InteractionStore(sys.argv[1])
i = 0
while True:
    futures = [store.submit("interactions", interaction(i + k)) for k in range(20)]
    for f in futures:
        f.result()
    for k in range(20):
        print(i + k, flush=True)  # acknowledged: committed before it is printed
    i += 20
"""


def test_kill_mid_write_loses_nothing_acknowledged(tmp_path: Path, store_url: str) -> None:
    helper = tmp_path / "tests_store_helper.py"
    helper.write_text(Path(__file__).read_text().split("WRITER = ")[0])
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, store_url], stdout=subprocess.PIPE, text=True, env=env
    )
    acknowledged = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while len(acknowledged) < 200 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acknowledged.append(f"int_{int(line)}")
    proc.send_signal(signal.SIGKILL)  # mid-write: the writer is committing the next batches
    proc.wait(10)
    assert len(acknowledged) >= 200, "writer subprocess did not get going"
    if store_url.startswith("sqlite"):
        db = store_url.removeprefix("sqlite:///")
        assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with InteractionStore(store_url) as store:
        stored = [r.id for r in store.interactions()]
    assert set(acknowledged) <= set(stored) and len(stored) == len(set(stored))
