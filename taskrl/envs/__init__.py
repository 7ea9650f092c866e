"""Built-in environments. ``taskrl.env.BUILTIN_ENVS`` registers them by entry point; ``make`` imports them."""

from taskrl.envs.builtin import NoopEnv, ShopEnv

__all__ = ["NoopEnv", "ShopEnv"]
