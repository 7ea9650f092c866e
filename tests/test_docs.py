"""The documentation site builds offline with every link resolving (``make docs``), a broken link fails the build,
and every Python example in the README and docs/ runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean"]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MKDOCS, "-d", str(site)], cwd=root, capture_output=True, text=True, timeout=600)


def test_the_site_builds_offline_with_every_link_resolving(tmp_path: Path) -> None:
    done = _build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stderr[-4000:]
    index = (tmp_path / "site" / "index.html").read_text()
    assert "Two commands" in index  # the README is the home page
    assert 'href="experiments/demo/"' in index  # its repository links point at site pages
    assert (tmp_path / "site" / "results" / "index.html").is_file()
    assert "class=\"doc doc-object" in (tmp_path / "site" / "api" / "env" / "index.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", ignore=shutil.ignore_patterns("*.png", "*.json"))
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    (copy / "benchmarks").mkdir()
    shutil.copy(ROOT / "benchmarks" / "RESULTS.md", copy / "benchmarks" / "RESULTS.md")
    shutil.copytree(ROOT / "taskrl", copy / "taskrl", ignore=shutil.ignore_patterns("__pycache__"))
    page = copy / "docs" / "design" / "agent-loop.md"
    page.write_text(page.read_text() + "\nSee [the old notes](../DECISIONS.md).\n")
    done = _build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "DECISIONS.md" in done.stdout + done.stderr


def _python_examples() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for page in pages:
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
            found.append((f"{page.relative_to(ROOT)}#{i}", block))
    return found


@pytest.mark.parametrize(("where", "code"), _python_examples(), ids=[w for w, _ in _python_examples()])
def test_every_python_example_in_the_docs_runs(where: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=env)  # fmt: skip
    assert done.returncode == 0, f"{where} no longer runs:\n{done.stderr[-4000:]}"
