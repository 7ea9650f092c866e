"""Import cycles and upward imports in ``taskrl`` (issues 15 and 39), read from the source with ``ast`` (nothing is
imported).

Every import counts: module level, inside functions (the way cycles hide) and under ``TYPE_CHECKING`` (a cycle in
the types is a cycle in the design). No cycle: ``distributed/ddp.py`` is a leaf of collectives (its launcher, which
builds a ``Trainer``, is ``distributed/launch.py``), the learner takes ``derive_seed`` from the ``seeding`` leaf,
scoring reads the env contract from the ``hooks`` leaf, the registry names the built-in envs by entry point, the
swarm env is handed its sub-agent runtime by its factory, and the algorithms never read the trainer's config. Every
module sits in a layer of ``LAYERS`` and imports only its own layer and lower ones; in particular the core
(``algos``, ``scoring``, ``env``, ``types``) never imports ``training``, ``deploy`` or ``distributed``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import taskrl

ROOT = Path(taskrl.__file__).parent

def _modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    return skip


def import_graph(*, lazy: bool, type_only: bool = False, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the taskrl modules it imports: at module level only, or also inside functions (``lazy``), and also
    under ``if TYPE_CHECKING:`` (``type_only``); ``root`` is the package directory read."""
    modules = _modules(root)

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        skip = set() if type_only else _type_checking_nodes(tree)
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


def test_no_import_cycle_even_through_function_level_and_type_only_imports() -> None:
    graph = import_graph(lazy=True, type_only=True)
    assert "taskrl.training.trainer" not in graph["taskrl.distributed.ddp"]
    assert "taskrl.rollout" not in graph["taskrl.training.learner"]
    assert "taskrl.envs" not in graph["taskrl.env"]  # built-ins are entry points, imported by ``make``
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(
        f"{sorted(c)}: " + ", ".join(f"{a} -> {b}" for a in sorted(c) for b in sorted(graph[a] & c)) for c in found
    )


LAYERS: tuple[tuple[str, ...], ...] = (
    ("taskrl", "taskrl.moved", "taskrl.validate", "taskrl.seeding", "taskrl.paths", "taskrl.types", "taskrl.tools",
     "taskrl.parsing", "taskrl.chat", "taskrl.hooks", "taskrl.env", "taskrl.scoring", "taskrl.env_spec",
     "taskrl.algos"),
    ("taskrl.policies",),
    ("taskrl.rollout", "taskrl.context"),
    ("taskrl.rewards",),
    ("taskrl.envs",),
    ("taskrl.datagen",),
    ("taskrl.monitor", "taskrl.monitors", "taskrl.runlog", "taskrl.eval", "taskrl.task_files", "taskrl.cli_options"),
    ("taskrl.training", "taskrl.distributed"),
    ("taskrl.recipes",),
    ("taskrl.deploy",),
    ("taskrl.report",),
    ("taskrl.commands",),
    ("taskrl.cli", "taskrl.__main__"),
)  # fmt: skip
"""The package map, lowest first (docs/design/index.md §2): a module imports its own layer and the ones before it,
in any form (module level, in a function, under TYPE_CHECKING). A package names all its submodules."""
FLOOR = ("taskrl.algos", "taskrl.scoring", "taskrl.env", "taskrl.types")
"""The core every other part is built on (issue 39's floor rule, also implied by ``LAYERS``)."""
ABOVE_THE_FLOOR = ("taskrl.training", "taskrl.deploy", "taskrl.distributed", "taskrl.commands", "taskrl.cli")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_of(module: str) -> int:
    """Index in ``LAYERS`` of the longest name that is ``module`` or a package holding it."""
    matches = [(len(name), i) for i, layer in enumerate(LAYERS) for name in layer if _within(module, (name,))]
    assert matches, f"{module} is in no layer: add it to LAYERS in tests/test_import_cycles.py and the package map"
    return max(matches)[1]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports a layer built on its own."""
    return sorted((module, target) for module, targets in graph.items() for target in targets
                  if layer_of(target) > layer_of(module))  # fmt: skip


def test_the_core_never_imports_training_deploy_or_distributed() -> None:
    graph = import_graph(lazy=True, type_only=True)
    found = [(m, t) for m, targets in graph.items() if _within(m, FLOOR) for t in targets
             if _within(t, ABOVE_THE_FLOOR)]  # fmt: skip
    assert not found, "the core imports what is built on it:\n" + "\n".join(f"{a} -> {b}" for a, b in found)


def test_no_module_imports_a_layer_built_on_it() -> None:
    found = upward_imports(import_graph(lazy=True, type_only=True))
    assert not found, "upward imports:\n" + "\n".join(f"{a} -> {b}" for a, b in found)


def test_a_type_only_circle_and_an_upward_import_are_found_in_any_form(tmp_path: Path) -> None:
    pkg = tmp_path / "taskrl"
    for name, body in {
        "__init__.py": "", "types.py": "", "training/__init__.py": "",
        "training/config.py": "import taskrl.algos.grpo\n",
        "algos/__init__.py": "", "algos/grpo.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from taskrl.training.config import TrainConfig\n",
        "scoring.py": "def f():\n    from taskrl.training import config\n",
        "envs/__init__.py": "", "envs/search.py": "from ..datagen import multihop\n",
        "datagen/__init__.py": "", "datagen/multihop.py": "",
    }.items():  # fmt: skip
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(body)
    found = upward_imports(import_graph(lazy=True, type_only=True, root=pkg))
    assert {("taskrl.algos.grpo", "taskrl.training.config"), ("taskrl.scoring", "taskrl.training"),
            ("taskrl.envs.search", "taskrl.datagen.multihop")} <= set(found)  # fmt: skip
    assert {importer for importer, _ in found} == {"taskrl.algos.grpo", "taskrl.scoring", "taskrl.envs.search"}
    at_module_level = upward_imports(import_graph(lazy=False, root=pkg))
    assert {importer for importer, _ in at_module_level} == {"taskrl.envs.search"}
    circle = {"taskrl.algos.grpo", "taskrl.training.config"}
    assert cycles(import_graph(lazy=True, type_only=True, root=pkg)) == [circle]
    assert cycles(import_graph(lazy=True, root=pkg)) == []  # the circle closes only through TYPE_CHECKING


def test_the_registry_imports_no_env_until_one_is_made() -> None:
    code = (
        "import sys, taskrl.env as e; specs = e.registry(); "
        "assert {'search', 'swarm', 'code-bugs'} <= set(specs), specs; "
        "assert not [m for m in sys.modules if m.startswith('taskrl.envs')], sorted(sys.modules); "
        "assert type(e.make('shop')).__name__ == 'ShopEnv'; assert 'taskrl.envs.builtin' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent)
