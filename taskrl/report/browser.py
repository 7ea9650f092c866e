"""Headless Chromium over the DevTools protocol on a pipe: open a page, evaluate JS, click, take screenshots.

Used by ``taskrl report --screenshot`` and the browser test. It needs only a local ``chromium`` binary (Debian's
package; ``make sysdeps`` installs it) and the standard library: the protocol runs over file descriptors 3 and 4
(``--remote-debugging-pipe``), so no port is opened, no websocket library is needed and nothing is downloaded.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
    "--remote-debugging-pipe",
)  # fmt: skip


class BrowserError(RuntimeError):
    """Chromium is missing, did not start, or a page action failed."""


def find_chromium() -> str:
    """Path of a Chromium binary, or a BrowserError that says how to install one."""
    for name in (os.environ.get("TASKRL_CHROMIUM", ""), *CANDIDATES):
        if name and (path := shutil.which(name)):
            return path
    raise BrowserError("no chromium found; install Debian's package (`make sysdeps` or `apt-get install chromium`) "
                       "or set TASKRL_CHROMIUM to a Chromium binary")  # fmt: skip


class HeadlessChromium:
    """One headless browser with one page. Use as a context manager; every wait has ``timeout_s``."""

    def __init__(self, *, width: int = 1440, height: int = 900, timeout_s: float = 30.0) -> None:
        self.width, self.height, self.timeout_s = width, height, timeout_s
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.mkdtemp(prefix="taskrl-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def wire_fds() -> None:  # in the child: the protocol expects to read fd 3 and write fd 4
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [find_chromium(), *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
                "about:blank"]  # fmt: skip
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - open for the browser's lifetime, closed in close()
        self.process = subprocess.Popen(args, preexec_fn=wire_fds, close_fds=False, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=self._log)  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        try:
            target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            self.call("Page.enable")
            self.call("Runtime.enable")
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        except BrokenPipeError as e:
            raise BrowserError(f"chromium exited: {self._stderr_tail()}") from e
        deadline = time.monotonic() + self.timeout_s
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise BrowserError(f"{method} failed: {reply['error'].get('message')}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError(f"chromium did not answer {method} within {self.timeout_s:g}s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited: {self._stderr_tail()}")
            self._buffer += chunk

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One DevTools command on the page."""
        return self._call(method, params, self._session)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of a JS expression on the page (promises are awaited); page exceptions raise."""
        out = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in out:
            details = out["exceptionDetails"]
            raise BrowserError(f"page error: {details.get('exception', {}).get('description') or details.get('text')}")
        return out.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float | None = None) -> Any:
        """Poll until a JS expression is truthy; return its value."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise BrowserError(f"timed out waiting for {expression!r}")

    def open(self, url_or_path: str | Path, ready: str = "document.readyState === 'complete'") -> None:
        """Navigate to a URL or a local file and wait until ``ready`` holds."""
        url = str(url_or_path)
        if not url.startswith(("http:", "https:", "file:", "data:", "about:")):
            url = Path(url).resolve().as_uri()
        self.call("Page.navigate", {"url": url})
        self.wait_for(ready)

    def click(self, selector: str) -> None:
        """A real mouse click (press and release) at the centre of the first element matching ``selector``."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return null;"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()"
        )
        if not box:
            raise BrowserError(f"nothing on the page matches {selector!r}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})  # fmt: skip

    def screenshot(self, path: str | Path, *, full_page: bool = False) -> Path:
        """Save a PNG of the viewport (or the whole page)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": size[0], "height": size[1],
                                                           "scale": 1})  # fmt: skip
        path = Path(path)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", params)["data"]))
        return path

    def _stderr_tail(self) -> str:
        self._log.seek(0)
        lines = [ln for ln in self._log.read().decode(errors="replace").splitlines() if "dbus" not in ln]
        return " | ".join(lines[-3:]) or "no output"

    def close(self) -> None:
        """Close the browser (politely, then by force) and remove its profile."""
        if self.process.poll() is None:
            try:
                os.write(self._to_browser, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
                self.process.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(timeout=5)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)
