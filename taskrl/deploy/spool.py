"""A bounded local spool: rows the database could not take during an outage, replayed into it once it is back.

``Spool(path, max_rows)`` is an append-only JSONL file (one ``{"table", "row"}`` per line, flushed and
fsynced before a write is acknowledged), so a spooled row survives a crash of the server too; the store's
writer thread replays it in order when the database answers again and only then truncates the file.
The bound is ``max_rows`` rows (default 100,000, a few hundred MB of typical chat turns): a full spool
refuses, and the server then refuses to deliver responses it could not record (fail closed), so no
delivered response is ever silently lost.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

DEFAULT_SPOOL_ROWS = 100_000


class SpoolFullError(RuntimeError):
    """The spool holds ``max_rows`` rows already."""


class Spool:
    """Append-only, fsynced JSONL of (table, row) pairs with a row bound."""

    def __init__(self, path: str | Path, max_rows: int = DEFAULT_SPOOL_ROWS) -> None:
        if max_rows < 1:
            raise ValueError(f"spool max_rows must be >= 1, got {max_rows}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self.rows = len(self.load())  # rows a previous process left behind are replayed too

    def append(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        """Write ``items`` durably, or raise ``SpoolFullError`` without writing any of them."""
        with self._lock:
            if self.rows + len(items) > self.max_rows:
                raise SpoolFullError(f"spool {self.path} is full ({self.rows} of {self.max_rows} rows)")
            lines = "".join(json.dumps({"table": t, "row": r}, allow_nan=False) + "\n" for t, r in items)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(lines)
                f.flush()
                os.fsync(f.fileno())
            self.rows += len(items)

    def load(self) -> list[tuple[str, dict[str, Any]]]:
        """Every spooled item in write order; a torn last line (a crash mid-write, never acknowledged) is dropped."""
        if not self.path.exists():
            return []
        items = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            items.append((str(item["table"]), dict(item["row"])))
        return items

    def clear(self) -> None:
        with self._lock:
            self.path.unlink(missing_ok=True)
            self.rows = 0
