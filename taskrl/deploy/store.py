"""The interaction store: every served request/response, its feedback, and every rollout decision.

``InteractionStore(url)`` opens SQLite (WAL, the default: ``sqlite:///path.db``) or PostgreSQL
(``postgresql+psycopg://...``) through SQLAlchemy. Writes go through one group-commit thread: ``await
store.add_interaction(...)`` returns once the row is committed, so an acknowledged response is durable,
while many concurrent requests share one transaction (and one fsync) instead of queueing on the lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any

import sqlalchemy as sa

from taskrl.types import new_id

_METADATA = sa.MetaData()
INTERACTIONS = sa.Table(
    "interactions",
    _METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("tenant", sa.String(128), nullable=False, index=True),
    sa.Column("session_id", sa.String(256), nullable=False, index=True),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("policy_version", sa.Integer, nullable=False, index=True),
    sa.Column("route", sa.String(32), nullable=False),
    sa.Column("shadow", sa.Boolean, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("request", sa.JSON, nullable=False),
    sa.Column("response", sa.JSON, nullable=False),
    sa.Column("prompt_token_ids", sa.JSON),
    sa.Column("completion_token_ids", sa.JSON, nullable=False),
    sa.Column("logprobs", sa.JSON, nullable=False),
    sa.Column("tool_calls", sa.JSON, nullable=False),
)
FEEDBACK = sa.Table(
    "feedback",
    _METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("interaction_id", sa.String(64), sa.ForeignKey("interactions.id"), nullable=False, index=True),
    sa.Column("tenant", sa.String(128), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("value", sa.Float),
    sa.Column("created_at", sa.Float, nullable=False),
)
DECISIONS = sa.Table(
    "decisions",
    _METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False, index=True),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("from_version", sa.Integer),
    sa.Column("to_version", sa.Integer),
    sa.Column("evidence", sa.JSON, nullable=False),
)
_TABLES = {"interactions": INTERACTIONS, "feedback": FEEDBACK, "decisions": DECISIONS}


class StoreError(RuntimeError):
    """The interaction store could not write or read (bad URL, unreachable database, constraint broken)."""


@dataclass
class Interaction:
    """One served assistant turn, with the exact tokens the policy conditioned on and sampled."""

    tenant: str
    """Who sent it (from the API key); reads are always filtered by tenant."""
    session_id: str
    """Client session (``X-Session-Id`` header or the request's ``user`` field); routing is sticky per session."""
    model: str
    """Served model name the client asked for."""
    policy_version: int
    """Version of the policy that produced the response."""
    request: dict[str, Any]
    """Messages, tools and sampling parameters as received."""
    response: dict[str, Any]
    """Content, tool calls and finish reason as returned (or, for shadow runs, as they would have been)."""
    completion_token_ids: list[int]
    """Sampled token ids (mask 1 in training)."""
    logprobs: list[float]
    """Sampler log-probabilities of ``completion_token_ids``."""
    prompt_token_ids: list[int] | None = None
    """Exact prompt ids the policy conditioned on (None when the backend does not report them)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Tool calls in OpenAI's shape."""
    latency_ms: float = 0.0
    """Time the policy took to answer."""
    route: str = "stable"
    """Router arm: stable, canary, holdout or shadow."""
    shadow: bool = False
    """True when the response was not returned to the client (shadow mode)."""
    id: str = field(default_factory=lambda: new_id("int"))
    created_at: float = field(default_factory=time.time)


@dataclass
class Feedback:
    """One user signal about an interaction (see ``taskrl.deploy.feedback`` for the kinds)."""

    interaction_id: str
    tenant: str
    kind: str
    value: float | None = None
    id: str = field(default_factory=lambda: new_id("fb"))
    created_at: float = field(default_factory=time.time)


@dataclass
class Decision:
    """A router or gate decision (advance, promote, rollback, block) with the evidence behind it."""

    model: str
    kind: str
    from_version: int | None
    to_version: int | None
    evidence: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("dec"))
    created_at: float = field(default_factory=time.time)


def _sqlite_pragmas(synchronous: str) -> Any:
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # WAL lets readers run beside the writer. In WAL mode NORMAL already survives a killed process;
        # FULL also survives power loss, at one fsync per group commit.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute("PRAGMA busy_timeout=10000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return on_connect


class InteractionStore:
    """Interactions, feedback and decisions in one SQL database; safe to share across threads and event loops."""

    def __init__(self, url: str, *, max_batch: int = 512, sqlite_synchronous: str = "FULL") -> None:
        """Open (and create the tables of) the store at ``url``; ``sqlite_synchronous`` is FULL or NORMAL."""
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if sqlite_synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"sqlite_synchronous must be FULL or NORMAL, got {sqlite_synchronous!r}")
        if "://" not in url:
            raise StoreError(
                f"store URL {url!r} is not a database URL; use sqlite:///path.db or postgresql+psycopg://..."
            )
        try:
            self.engine = sa.create_engine(url, future=True)
        except (sa.exc.ArgumentError, ImportError) as exc:
            raise StoreError(f"cannot open store {url!r}: {exc}") from exc
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_pragmas(sqlite_synchronous))
        try:
            _METADATA.create_all(self.engine)
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot create tables in {url!r}: {exc}") from exc
        self.url = url
        self.max_batch = max_batch
        self._queue: queue.Queue[tuple[str, dict[str, Any], concurrent.futures.Future[None]] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="taskrl-store-writer", daemon=True)
        self._writer.start()
        self._closed = False

    # -- writes ------------------------------------------------------------------------------------
    def submit(self, table: str, row: Interaction | Feedback | Decision) -> concurrent.futures.Future[None]:
        """Queue ``row`` for the group-commit writer; the future resolves once it is committed."""
        if self._closed:
            raise StoreError("store is closed")
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Shallow: dataclasses.asdict deep-copies every token id and cost ~2 ms per interaction.
        self._queue.put((table, {f.name: getattr(row, f.name) for f in fields(row)}, future))
        return future

    async def add(self, table: str, row: Interaction | Feedback | Decision) -> None:
        """Write ``row`` and wait (without blocking the event loop) until it is durable."""
        await asyncio.wrap_future(self.submit(table, row))

    def add_sync(self, table: str, row: Interaction | Feedback | Decision, timeout_s: float = 30.0) -> None:
        self.submit(table, row).result(timeout_s)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)  # finish this batch, then stop
                    break
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list[tuple[str, dict[str, Any], concurrent.futures.Future[None]]]) -> None:
        try:
            with self.engine.begin() as conn:
                for name in _TABLES:
                    rows = [row for table, row, _ in batch if table == name]
                    if rows:
                        conn.execute(_TABLES[name].insert(), rows)
        except sa.exc.SQLAlchemyError:
            # One bad row (a duplicate id, a dangling foreign key) must not fail its neighbours: retry alone.
            for table, row, future in batch:
                try:
                    with self.engine.begin() as conn:
                        conn.execute(_TABLES[table].insert(), [row])
                except sa.exc.SQLAlchemyError as exc:
                    future.set_exception(StoreError(f"cannot write {table} row {row.get('id')}: {exc.orig}"))
                else:
                    future.set_result(None)
            return
        for _, _, future in batch:
            future.set_result(None)

    def close(self, timeout_s: float = 30.0) -> None:
        """Commit everything queued, then stop the writer and release connections."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._writer.join(timeout_s)
        self.engine.dispose()

    def __enter__(self) -> InteractionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads -------------------------------------------------------------------------------------
    def interactions(
        self,
        *,
        tenant: str | None = None,
        session_id: str | None = None,
        ids: list[str] | None = None,
        min_version: int | None = None,
        model: str | None = None,
        include_shadow: bool = True,
    ) -> list[Interaction]:
        """Interactions in creation order; ``tenant`` None reads all tenants (training, never the API)."""
        query = sa.select(INTERACTIONS).order_by(INTERACTIONS.c.created_at, INTERACTIONS.c.id)
        if tenant is not None:
            query = query.where(INTERACTIONS.c.tenant == tenant)
        if session_id is not None:
            query = query.where(INTERACTIONS.c.session_id == session_id)
        if ids is not None:
            query = query.where(INTERACTIONS.c.id.in_(ids))
        if min_version is not None:
            query = query.where(INTERACTIONS.c.policy_version >= min_version)
        if model is not None:
            query = query.where(INTERACTIONS.c.model == model)
        if not include_shadow:
            query = query.where(INTERACTIONS.c.shadow.is_(False))
        with self.engine.connect() as conn:
            return [Interaction(**row._asdict()) for row in conn.execute(query)]

    def get_interaction(self, interaction_id: str, *, tenant: str) -> Interaction | None:
        found = self.interactions(tenant=tenant, ids=[interaction_id])
        return found[0] if found else None

    def feedback(self, *, interaction_ids: list[str] | None = None, tenant: str | None = None) -> list[Feedback]:
        query = sa.select(FEEDBACK).order_by(FEEDBACK.c.created_at, FEEDBACK.c.id)
        if interaction_ids is not None:
            query = query.where(FEEDBACK.c.interaction_id.in_(interaction_ids))
        if tenant is not None:
            query = query.where(FEEDBACK.c.tenant == tenant)
        with self.engine.connect() as conn:
            return [Feedback(**row._asdict()) for row in conn.execute(query)]

    def decisions(self, *, model: str | None = None) -> list[Decision]:
        query = sa.select(DECISIONS).order_by(DECISIONS.c.created_at, DECISIONS.c.id)
        if model is not None:
            query = query.where(DECISIONS.c.model == model)
        with self.engine.connect() as conn:
            return [Decision(**row._asdict()) for row in conn.execute(query)]

    def count(self, table: str = "interactions") -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_TABLES[table])).scalar_one())

    def max_version(self, model: str | None = None) -> int | None:
        query = sa.select(sa.func.max(INTERACTIONS.c.policy_version))
        if model is not None:
            query = query.where(INTERACTIONS.c.model == model)
        with self.engine.connect() as conn:
            value = conn.execute(query).scalar_one()
        return None if value is None else int(value)
