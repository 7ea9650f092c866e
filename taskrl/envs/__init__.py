"""Built-in environments. Importing this package registers them (``taskrl.env.registry()`` does it)."""

from taskrl.env import register
from taskrl.envs.builtin import NoopEnv, ShopEnv

register("shop", ShopEnv, description="look up item prices and compute an order total (2 tools)")
register("noop", NoopEnv, description="call a no-op tool N times, then answer 'done' (loop benchmarks)")

__all__ = ["NoopEnv", "ShopEnv"]
