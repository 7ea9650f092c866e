"""Built-in environments. Importing this package registers them (``taskrl.env.registry()`` does it)."""

from taskrl.env import register
from taskrl.envs.builtin import NoopEnv, PriceEnv, ShopEnv
from taskrl.envs.code import make_codebugs_env, make_humaneval_env
from taskrl.envs.prices import PricesEnv
from taskrl.envs.search import make_search_env
from taskrl.envs.swarm import make_swarm_env

register("shop", ShopEnv, description="look up item prices and compute an order total (2 tools)")
register("price", PriceEnv, description="look up one price, answer quantity x price (1 tool; the demo env)")
register("prices", PricesEnv, description="look up 1-3 prices, list them (1 tool; the learning recipe env)")
register("noop", NoopEnv, description="call a no-op tool N times, then answer 'done' (loop benchmarks)")
register("code-humaneval", make_humaneval_env, description="Composer coding: HumanEval in a sandbox, hidden tests")
register("code-bugs", make_codebugs_env, description="Composer coding: fix bugs mined from PyPI projects")
register("swarm", make_swarm_env, description="Kimi PARL agent swarm: orchestrator + frozen concurrent sub-agents")
register("search", make_search_env, description="Context-1 agentic search: hybrid search, prune_chunks, F-beta reward")

__all__ = ["NoopEnv", "ShopEnv"]
