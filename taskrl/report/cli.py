"""``taskrl report RUN_DIR -o report.html [--screenshot report.png]``: the command over ``build_report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from taskrl.report.browser import BrowserError, HeadlessChromium
from taskrl.report.data import ReportError
from taskrl.report.html import build_report


def screenshot_report(report: Path, png: Path, *, width: int = 1440, height: int = 900) -> Path:
    """A PNG of the report as a reader sees it: the top of the page and, side by side, the first trajectory opened."""
    with HeadlessChromium(width=width, height=height) as browser:
        browser.open(report, ready="!!document.body && document.body.dataset.ready === '1'")
        errors = browser.evaluate("window.__reportErrors")
        if errors:
            raise ReportError(f"the report's script failed in Chromium: {errors[0]}")
        if browser.evaluate("document.querySelector('tr.traj-row') !== null"):
            browser.click("tr.traj-row")
            browser.wait_for("document.querySelector('#traj-detail .traj-detail-body') !== null")
            browser.evaluate("document.getElementById('trajectories').scrollIntoView()")
        return browser.screenshot(png)


def report_command(
    path: Annotated[Path, typer.Argument(help="run directory (taskrl.runlog layout) or a trajectories .jsonl file")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write")] = Path("report.html"),
    max_trajectories: Annotated[int, typer.Option(help="most trajectories embedded (best and worst kept)")] = 300,
    title: Annotated[str | None, typer.Option(help="page title (default: the run's name)")] = None,
    screenshot: Annotated[Path | None, typer.Option(help="also save a PNG of the report (needs chromium)")] = None,
) -> None:
    """Write a self-contained HTML report: metric plots, monitors and alerts, eval tables, trajectory viewer."""
    if max_trajectories < 1:
        raise ReportError(f"--max-trajectories must be >= 1, got {max_trajectories}")
    written = build_report(path, out, max_trajectories=max_trajectories, title=title)
    size_kb = written.stat().st_size / 1024
    typer.echo(f"report: {written} ({size_kb:.0f} KB, self-contained; open it in any browser)")
    if screenshot is not None:
        try:
            typer.echo(f"screenshot: {screenshot_report(written, screenshot)}")
        except BrowserError as e:
            raise ReportError(str(e)) from e
