"""The interaction store: every served request/response, its feedback, and every rollout decision.

``InteractionStore(url)`` opens SQLite (WAL, the default: ``sqlite:///path.db``) or PostgreSQL
(``postgresql+psycopg://...``) through SQLAlchemy. Writes go through one group-commit thread: ``await
store.add_interaction(...)`` returns once the row is committed, so an acknowledged response is durable,
while many concurrent requests share one transaction (and one fsync) instead of queueing on the lock.
With a ``spool_path``, a batch the database cannot take (outage: connection refused or lost) goes to a bounded
local spool (``taskrl.deploy.spool``) and is replayed in order once the database answers; without one, or
when it is full, the write fails and the server refuses the response (fail closed). Feedback is one row per
(interaction, kind): a later signal replaces the earlier one (latest wins).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import queue
import secrets
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from taskrl.deploy.spool import DEFAULT_SPOOL_ROWS, Spool, SpoolFullError

logger = logging.getLogger(__name__)
REPLAY_EVERY_S = 1.0
"""How often the writer retries the database while rows wait in the spool."""


def new_id(prefix: str) -> str:
    """A 128-bit random id (unguessable: interaction ids are capabilities for feedback)."""
    return f"{prefix}_{secrets.token_hex(16)}"


def feedback_id(interaction_id: str, kind: str) -> str:
    """The one feedback row of (interaction, kind): posting the same kind again replaces it."""
    return "fb_" + hashlib.blake2b(f"{interaction_id}\x00{kind}".encode(), digest_size=16).hexdigest()

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
    sa.Column("sampling", sa.JSON),
    sa.Column("delivered", sa.Boolean),
    sa.Column("adapter", sa.JSON),
)
_TENANT_PAGE_INDEX = sa.Index(
    "ix_interactions_tenant_page", INTERACTIONS.c.tenant, INTERACTIONS.c.created_at, INTERACTIONS.c.id
)
"""A tenant's newest-first page is an index range scan, whatever the history's size."""
_ADDED_COLUMNS = {"interactions": ("sampling", "delivered", "adapter")}
"""Columns newer than the first schema: added to existing databases when they are opened."""
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
_UNDELIVERED = "_undelivered"
"""Pseudo-table of the writer queue: ``{"id"}`` of an interaction whose response never reached the client."""


def _is_outage(exc: BaseException) -> bool:
    """The database is unreachable or dropped the connection (as opposed to refusing a bad row)."""
    if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
        return True
    return isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated


def _reason(exc: sa.exc.SQLAlchemyError) -> str:
    """The database driver's own error when SQLAlchemy wraps one (its message, without SQLAlchemy's preamble)."""
    return str(exc.orig if isinstance(exc, sa.exc.StatementError) else exc)


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
    sampling: dict[str, Any] | None = None
    """Effective sampling of the turn: temperature (0 = greedy), top_p, top_k, seed, max_new_tokens."""
    delivered: bool = True
    """False when the response never reached the client (the stream broke); never trained on."""
    adapter: dict[str, Any] | None = None
    """The LoRA adapter that served the turn (``name``, ``path``, ``version``); None for base weights."""


@dataclass
class Feedback:
    """One user signal about an interaction (see ``taskrl.deploy.feedback`` for the kinds)."""

    interaction_id: str
    tenant: str
    kind: str
    value: float | None = None
    id: str = ""
    """Derived from (interaction_id, kind) when empty, so a repeated signal replaces the earlier one."""
    created_at: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = feedback_id(self.interaction_id, self.kind)


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

    def __init__(
        self,
        url: str,
        *,
        max_batch: int = 512,
        sqlite_synchronous: str = "FULL",
        spool_path: str | Path | None = None,
        spool_max_rows: int = DEFAULT_SPOOL_ROWS,
    ) -> None:
        """Open (and create the tables of) the store at ``url``; ``sqlite_synchronous`` is FULL or NORMAL.

        ``spool_path`` enables the outage spool (bounded by ``spool_max_rows``); rows a previous process
        spooled there are replayed as soon as the database answers.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if sqlite_synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"sqlite_synchronous must be FULL or NORMAL, got {sqlite_synchronous!r}")
        if "://" not in url:
            raise StoreError(
                f"store URL {url!r} is not a database URL; use sqlite:///path.db or postgresql+psycopg://..."
            )
        try:
            # pre_ping: after an outage the pool's connections are dead; test each before use instead of failing.
            self.engine = sa.create_engine(url, future=True, pool_pre_ping=True)
        except (sa.exc.ArgumentError, ImportError) as exc:
            raise StoreError(f"cannot open store {url!r}: {exc}") from exc
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_pragmas(sqlite_synchronous))
        try:
            _METADATA.create_all(self.engine)
            self._add_missing_columns()
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot create tables in {url!r}: {exc}") from exc
        self.url = url
        self.max_batch = max_batch
        self.spool = Spool(spool_path, spool_max_rows) if spool_path is not None else None
        self.spooled_total = 0
        self.replayed_total = 0
        self._queue: queue.Queue[tuple[str, dict[str, Any], concurrent.futures.Future[str]] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="taskrl-store-writer", daemon=True)
        self._writer.start()
        self._closed = False

    def _add_missing_columns(self) -> None:
        _TENANT_PAGE_INDEX.create(self.engine, checkfirst=True)  # databases created before the index existed
        inspector = sa.inspect(self.engine)
        for table_name, names in _ADDED_COLUMNS.items():
            present = {c["name"] for c in inspector.get_columns(table_name)}
            table = _TABLES[table_name]
            for name in names:
                if name in present:
                    continue
                column_type = table.c[name].type.compile(dialect=self.engine.dialect)
                with self.engine.begin() as conn:
                    conn.execute(sa.text(f"ALTER TABLE {table_name} ADD COLUMN {name} {column_type}"))

    # -- writes ------------------------------------------------------------------------------------
    def submit(self, table: str, row: Interaction | Feedback | Decision) -> concurrent.futures.Future[str]:
        """Queue ``row`` for the group-commit writer; the future resolves to "committed" or "spooled"."""
        return self._submit(table, asdict(row))  # a deep copy: the writer thread sees the row as it was submitted

    def _submit(self, table: str, row: dict[str, Any]) -> concurrent.futures.Future[str]:
        if self._closed:
            raise StoreError("store is closed")
        future: concurrent.futures.Future[str] = concurrent.futures.Future()
        # Shallow: dataclasses.asdict deep-copies every token id and cost ~2 ms per interaction.
        self._queue.put((table, row, future))
        return future

    async def add(self, table: str, row: Interaction | Feedback | Decision) -> str:
        """Write ``row`` and wait (without blocking the event loop) until it is durable: "committed" or "spooled"."""
        return await asyncio.wrap_future(self.submit(table, row))

    def add_sync(self, table: str, row: Interaction | Feedback | Decision, timeout_s: float = 30.0) -> str:
        return self.submit(table, row).result(timeout_s)

    def mark_undelivered(self, interaction_id: str) -> concurrent.futures.Future[str]:
        """Flag a logged interaction whose response never reached the client (applied after its insert)."""
        return self._submit(_UNDELIVERED, {"id": interaction_id})

    def _write_loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=REPLAY_EVERY_S if self.spool is not None and self.spool.rows else None)
            except queue.Empty:
                self._replay()
                continue
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

    def _insert(self, conn: Any, name: str, rows: list[dict[str, Any]], *, replay: bool = False) -> None:
        if name == _UNDELIVERED:
            ids = [r["id"] for r in rows]
            conn.execute(INTERACTIONS.update().where(INTERACTIONS.c.id.in_(ids)).values(delivered=False))
            return
        table = _TABLES[name]
        dialect = self.engine.dialect.name
        if dialect not in ("sqlite", "postgresql") or (name != "feedback" and not replay):
            conn.execute(table.insert(), rows)
            return
        if dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        if name != "feedback":  # a replay after a crash mid-replay: rows already in are skipped, not doubled
            conn.execute(insert(table).on_conflict_do_nothing(index_elements=["id"]), rows)
            return
        latest: dict[str, dict[str, Any]] = {}
        for row in rows:  # one statement may not touch a row twice: the latest of each id wins already here
            if row["id"] not in latest or row["created_at"] >= latest[row["id"]]["created_at"]:
                latest[row["id"]] = row
        stmt = insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=["id"],
            set_={c: stmt.excluded[c] for c in ("tenant", "value", "created_at")},
            where=table.c.created_at <= stmt.excluded.created_at,
        )
        conn.execute(stmt, list(latest.values()))

    def _write_grouped(self, conn: Any, items: list[tuple[str, dict[str, Any]]], *, replay: bool = False) -> None:
        for name in (*_TABLES, _UNDELIVERED):
            rows = [row for table, row in items if table == name]
            if rows:
                self._insert(conn, name, rows, replay=replay)

    def _replay(self) -> bool:
        """Move spooled rows into the database; True when the spool is empty afterwards."""
        if self.spool is None or not self.spool.rows:
            return True
        try:  # a cheap probe first: during an outage the spool is not re-read for every batch
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.SQLAlchemyError:
            return False
        items = self.spool.load()
        try:
            with self.engine.begin() as conn:
                self._write_grouped(conn, items, replay=True)
        except sa.exc.SQLAlchemyError as exc:
            if not _is_outage(exc):
                logger.error("spooled rows could not be replayed (kept in %s): %s", self.spool.path, exc)
            return False
        self.spool.clear()
        self.replayed_total += len(items)
        logger.warning("replayed %d spooled rows into %s", len(items), self.url)
        return True

    def _commit(self, batch: list[tuple[str, dict[str, Any], concurrent.futures.Future[str]]]) -> None:
        if not self._replay():  # still down: keep the order, this batch goes after what is spooled
            self._spool_or_fail(batch, "the database is still unreachable")
            return
        try:
            with self.engine.begin() as conn:
                self._write_grouped(conn, [(t, r) for t, r, _ in batch])
        except sa.exc.SQLAlchemyError as exc:
            if _is_outage(exc):
                self._spool_or_fail(batch, _reason(exc))
                return
            # One bad row (a duplicate id, a dangling foreign key) must not fail its neighbours: retry alone.
            for table, row, future in batch:
                try:
                    with self.engine.begin() as conn:
                        self._insert(conn, table, [row])
                except sa.exc.SQLAlchemyError as one:
                    future.set_exception(StoreError(f"cannot write {table} row {row.get('id')}: {one.orig}"))
                else:
                    future.set_result("committed")
            return
        for _, _, future in batch:
            future.set_result("committed")

    def _spool_or_fail(self, batch: list[tuple[str, dict[str, Any], concurrent.futures.Future[str]]], why: str) -> None:
        if self.spool is None:
            for _, _, future in batch:
                future.set_exception(StoreError(f"database unavailable and no spool configured: {why}"))
            return
        try:
            self.spool.append([(t, r) for t, r, _ in batch])
        except (SpoolFullError, OSError, ValueError) as exc:
            for _, _, future in batch:
                future.set_exception(StoreError(f"database unavailable ({why}) and the spool refused: {exc}"))
            return
        self.spooled_total += len(batch)
        for _, _, future in batch:
            future.set_result("spooled")

    def close(self, timeout_s: float = 30.0) -> None:
        """Commit everything queued (replaying the spool if the database is back), then stop the writer."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._writer.join(timeout_s)
        self._replay()
        self.engine.dispose()

    def __enter__(self) -> InteractionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads -------------------------------------------------------------------------------------
    def _rows(self, query: Any) -> list[Any]:
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(query))
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot read from the store: {_reason(exc)}") from exc

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
        query = _filtered(query, tenant, session_id, include_shadow)
        if ids is not None:
            query = query.where(INTERACTIONS.c.id.in_(ids))
        if min_version is not None:
            query = query.where(INTERACTIONS.c.policy_version >= min_version)
        if model is not None:
            query = query.where(INTERACTIONS.c.model == model)
        return [_interaction(row) for row in self._rows(query)]

    def interaction_page(
        self,
        *,
        tenant: str,
        session_id: str | None = None,
        limit: int = 100,
        after: str | None = None,
        include_shadow: bool = False,
    ) -> tuple[list[Interaction], bool]:
        """Newest first, ``limit`` rows older than interaction ``after`` (OpenAI's cursor), and whether more exist.

        Done in SQL (ORDER BY ... LIMIT on the created_at index), so a page costs the same at any history size.
        """
        query = _filtered(sa.select(INTERACTIONS), tenant, session_id, include_shadow)
        if after is not None:
            cursor = self._rows(
                sa.select(INTERACTIONS.c.created_at, INTERACTIONS.c.id).where(
                    INTERACTIONS.c.id == after, INTERACTIONS.c.tenant == tenant
                )
            )
            if not cursor:
                raise StoreError(f"no interaction {after!r} to page after")
            at, cid = cursor[0]
            older = sa.or_(
                INTERACTIONS.c.created_at < at, sa.and_(INTERACTIONS.c.created_at == at, INTERACTIONS.c.id < cid)
            )
            query = query.where(older)
        query = query.order_by(INTERACTIONS.c.created_at.desc(), INTERACTIONS.c.id.desc()).limit(limit + 1)
        rows = [_interaction(row) for row in self._rows(query)]
        return rows[:limit], len(rows) > limit

    def get_interaction(self, interaction_id: str, *, tenant: str, include_shadow: bool = False) -> Interaction | None:
        query = _filtered(sa.select(INTERACTIONS), tenant, None, include_shadow)
        found = self._rows(query.where(INTERACTIONS.c.id == interaction_id))
        return _interaction(found[0]) if found else None

    def feedback(self, *, interaction_ids: list[str] | None = None, tenant: str | None = None) -> list[Feedback]:
        """Feedback in creation order: one (the latest) signal per (interaction, kind), also for old databases."""
        query = sa.select(FEEDBACK).order_by(FEEDBACK.c.created_at, FEEDBACK.c.id)
        if interaction_ids is not None:
            query = query.where(FEEDBACK.c.interaction_id.in_(interaction_ids))
        if tenant is not None:
            query = query.where(FEEDBACK.c.tenant == tenant)
        latest: dict[tuple[str, str], Feedback] = {}
        for row in self._rows(query):
            item = Feedback(**row._asdict())
            latest.pop((item.interaction_id, item.kind), None)
            latest[(item.interaction_id, item.kind)] = item
        return list(latest.values())

    def decisions(self, *, model: str | None = None) -> list[Decision]:
        query = sa.select(DECISIONS).order_by(DECISIONS.c.created_at, DECISIONS.c.id)
        if model is not None:
            query = query.where(DECISIONS.c.model == model)
        return [Decision(**row._asdict()) for row in self._rows(query)]

    def count(self, table: str = "interactions") -> int:
        return int(self._rows(sa.select(sa.func.count()).select_from(_TABLES[table]))[0][0])

    def max_version(self, model: str | None = None) -> int | None:
        query = sa.select(sa.func.max(INTERACTIONS.c.policy_version))
        if model is not None:
            query = query.where(INTERACTIONS.c.model == model)
        value = self._rows(query)[0][0]
        return None if value is None else int(value)


def _filtered(query: Any, tenant: str | None, session_id: str | None, include_shadow: bool) -> Any:
    if tenant is not None:
        query = query.where(INTERACTIONS.c.tenant == tenant)
    if session_id is not None:
        query = query.where(INTERACTIONS.c.session_id == session_id)
    if not include_shadow:
        query = query.where(INTERACTIONS.c.shadow.is_(False))
    return query


def _interaction(row: Any) -> Interaction:
    data = row._asdict()
    data["delivered"] = data.get("delivered") is not False  # rows older than the column were delivered
    return Interaction(**data)
