"""Where taskrl keeps caches (converted models, built corpora, downloaded sdists), without importing torch."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$TASKRL_CACHE`` or ``~/.cache/taskrl``."""
    configured = os.environ.get("TASKRL_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "taskrl"
