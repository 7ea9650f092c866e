"""Composer-style coding environments: a bubblewrap sandbox, copy-on-write workspaces, seven coding tools,
hidden-test rewards with anti-hacking checks, HumanEval and bugs mined from PyPI sdists.

Modules: ``sandbox`` (isolation and limits), ``workspace`` (clones, snapshots, warm pool), ``tools`` (the
agent's tools), ``testrun`` (pytest in the sandbox), ``tasks`` (HumanEval, mined task sets), ``reward``
(hidden tests, tampering, effort), ``env`` (``HumanEvalEnv``, ``CodeBugsEnv``). Import ``taskrl.envs.code.env``
for the envs; this package itself imports nothing heavy.
"""

from __future__ import annotations

from typing import Any


def make_humaneval_env(**kwargs: Any) -> Any:
    """Registry factory of "code-humaneval" (imports the env only when one is built)."""
    from taskrl.envs.code.env import HumanEvalEnv

    return HumanEvalEnv(**kwargs)


def make_codebugs_env(**kwargs: Any) -> Any:
    """Registry factory of "code-bugs": the bundled inflection task set, or ``tasks_path=`` a mined one."""
    from taskrl.envs.code.env import CodeBugsEnv

    return CodeBugsEnv(**kwargs)
