"""Context-1 agentic search (docs/design/index.md §6): corpus ingest and store, hybrid search, tools with token budgets,
the F-beta reward. Importing this package is cheap; ``make_search_env`` imports chromadb, bm25s and the
embedder only when an env is built.
"""

from __future__ import annotations

from typing import Any


def make_search_env(**kwargs: Any) -> Any:
    """``SearchEnv(**kwargs)``: the factory registered as "search" (keyword arguments: SearchEnvConfig fields)."""
    from taskrl.envs.search.env import SearchEnv

    return SearchEnv(**kwargs)
