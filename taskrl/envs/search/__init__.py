"""Context-1 agentic search (docs/design/index.md §6): corpus ingest and store, hybrid search, tools with token budgets,
the F-beta reward. Importing this package is cheap; ``make("search")`` (``taskrl.recipes.make_search_env``)
imports chromadb, bm25s and the embedder only when an env is built.
"""

from taskrl.moved import moved_names

__getattr__ = moved_names(__name__, {"make_search_env": "taskrl.recipes"})
