"""Import cycles in ``taskrl`` (issue 15), read from the source with ``ast`` (nothing is imported).

No cycle, counting imports inside functions too (the way cycles hide): ``distributed/ddp.py`` is a leaf of
collectives (its launcher, which builds a ``Trainer``, is ``distributed/launch.py``), the learner takes
``derive_seed`` from the ``seeding`` leaf, scoring reads the env contract from the ``hooks`` leaf, and the
registry names the built-in envs by entry point instead of importing them.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import taskrl

ROOT = Path(taskrl.__file__).parent

def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def import_graph(*, lazy: bool) -> dict[str, set[str]]:
    """Module -> the taskrl modules it imports (at module level only, or anywhere with ``lazy``)."""
    modules = _modules()

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        skip = _type_checking_nodes(tree)
        nodes = ast.walk(tree) if lazy else (n for top in tree.body for n in ast.walk(top) if not isinstance(
            top, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef))  # fmt: skip
        for node in nodes:
            if id(node) in skip:
                continue
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    kept = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*kept, base] if base else kept)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            for name in names:
                target = resolve(name) if name.startswith("taskrl") else ""
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)  # a submodule importing its own package is not a cycle
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_level_import_cycle() -> None:
    assert cycles(import_graph(lazy=False)) == []


def test_no_import_cycle_even_through_function_level_imports() -> None:
    graph = import_graph(lazy=True)
    assert "taskrl.training.trainer" not in graph["taskrl.distributed.ddp"]
    assert "taskrl.rollout" not in graph["taskrl.training.learner"]
    assert "taskrl.envs" not in graph["taskrl.env"]  # built-ins are entry points, imported by ``make``
    assert cycles(graph) == []


def test_the_registry_imports_no_env_until_one_is_made() -> None:
    code = (
        "import sys, taskrl.env as e; specs = e.registry(); "
        "assert {'search', 'swarm', 'code-bugs'} <= set(specs), specs; "
        "assert not [m for m in sys.modules if m.startswith('taskrl.envs')], sorted(sys.modules); "
        "assert type(e.make('shop')).__name__ == 'ShopEnv'; assert 'taskrl.envs.builtin' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent)
