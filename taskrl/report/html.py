"""Render the report payload into one self-contained HTML file: inline CSS, inline JS, the data as embedded JSON.

Nothing is fetched at view time (no fonts, scripts or images from the network), so the file can be mailed,
attached to an issue or opened offline. The assets live in ``taskrl/report/assets``.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from pathlib import Path
from typing import Any

from taskrl.report.data import load_payload

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>taskrl report: {title}</title>
<style>{css}</style>
</head>
<body>
<header class="top">
  <h1 id="title">taskrl report</h1>
  <nav><a href="#metrics">Metrics</a><a href="#monitors">Monitors</a><a href="#evals">Evaluations</a>
       <a href="#trajectories">Trajectories</a></nav>
  <div class="chips" id="chips"></div>
</header>
<main>
<section id="metrics"><h2>Metrics over steps</h2><div id="metrics-body"></div></section>
<section id="monitors"><h2>Monitors and alerts</h2><div id="monitors-body"></div></section>
<section id="evals"><h2>Evaluations</h2><div id="evals-body"></div></section>
<section id="trajectories"><h2>Trajectories</h2><div id="trajectories-body"></div></section>
</main>
<script type="application/json" id="report-data">{data}</script>
<script>{js}</script>
</body>
</html>
"""


def _asset(name: str) -> str:
    return resources.files("taskrl.report").joinpath("assets", name).read_text(encoding="utf-8")


def render_html(payload: dict[str, Any]) -> str:
    """The page for a payload from ``load_payload``."""
    # "<" never occurs outside JSON strings, so escaping it everywhere keeps "</script>" in model text harmless.
    data = json.dumps(payload, ensure_ascii=False, allow_nan=False).replace("<", "\\u003c")
    return _PAGE.format(title=html.escape(str(payload.get("title", ""))), css=_asset("report.css"),
                        js=_asset("report.js"), data=data)  # fmt: skip


def build_report(path: str | Path, out: str | Path, *, max_trajectories: int = 300, title: str | None = None) -> Path:
    """Write the HTML report of a run directory (or a trajectories JSONL file) to ``out``; returns ``out``."""
    out = Path(out)
    page = render_html(load_payload(path, max_trajectories=max_trajectories, title=title))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)  # a reader never sees half a report
    return out
