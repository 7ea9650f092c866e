"""The HTML report of a run: ``build_report(RUN_DIR, "report.html")`` or ``taskrl report RUN_DIR -o report.html``.

``data`` turns a run directory (or a trajectories JSONL file) into a JSON payload, ``html`` renders it into one
self-contained page (plots, monitors and alerts, eval tables, trajectory and swarm viewers), ``browser`` drives
headless Chromium for screenshots and tests.
"""

from taskrl.report.data import ReportError, load_payload
from taskrl.report.html import build_report, render_html

__all__ = ["ReportError", "build_report", "load_payload", "render_html"]
