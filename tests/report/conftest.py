"""A demo-like run directory shared by the report tests (built once: real episodes through the loop)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from report_fixtures import build_demo_like_run


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return asyncio.run(build_demo_like_run(tmp_path_factory.mktemp("runs") / "demo", steps=4))
