"""Where moved modules and names went: importing an old path raises an ImportError that names the new one.

Convention (kept for one release after a move, then the entry goes): no module is left behind at the old path
and nothing is re-exported; ``import taskrl.trainer`` fails at once with ``taskrl.trainer moved to
taskrl.training.trainer``, so no caller keeps working on a path that is about to vanish. ``taskrl/__init__.py``
installs ``MovedModuleFinder`` first on ``sys.meta_path``: it answers only for the names listed here, and before any
other finder, so a stale copy of an old file (an editable install, a wheel upgraded in place) is never imported.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from typing import Any

MOVED_MODULES: dict[str, str] = {
    "taskrl.trainer": "taskrl.training.trainer",
    "taskrl.feedback_trust": "taskrl.deploy.feedback_trust",
    "taskrl.rewards.curriculum": "taskrl.training.curriculum",
    "taskrl.training.command": "taskrl.commands.train",
    "taskrl.training.demo": "taskrl.commands.demo",
    "taskrl.training.precision": "taskrl.policies.precision",  # the vLLM server resolves dtype "auto" by it
}
"""Old module path -> its new place (moved in 0.1.x, issue 39; these entries go in 0.2)."""


class MovedError(ImportError):
    """An old import path of a module or name that moved; the message names the new place."""


class MovedModuleFinder(MetaPathFinder):
    """Answers only for ``MOVED_MODULES``: raises ``MovedError`` naming the new module instead of 'No module'."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname in MOVED_MODULES:
            raise MovedError(f"{fullname} moved to {MOVED_MODULES[fullname]}: import it from there "
                             f"(the old path is gone since taskrl 0.1.x)", name=fullname)  # fmt: skip
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())


def moved_names(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that left ``module``: ``names`` maps each to the module now holding it."""

    def __getattr__(name: str) -> Any:
        if name in names:
            raise MovedError(f"{module}.{name} moved to {names[name]}.{name}: import it from there", name=module)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
