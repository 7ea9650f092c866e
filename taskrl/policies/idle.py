"""An engine's idle state and the delayed release of what it keeps between requests.

The continuous engine keeps its batch KV buffers between requests (re-allocating them per turn cost more than the
forwards) and frees them once it has stayed idle for a while. ``IdleState`` holds that state: busy or idle, which
idle spell this is (a release armed in an earlier spell does nothing), and the one timer pending at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class IdleState:
    """Busy/idle of one engine, and one pending ``on_idle(spell)`` call ``delay_s`` after each idle spell began."""

    def __init__(self, on_idle: Callable[[int], None]) -> None:
        self._on_idle = on_idle
        self._event = threading.Event()
        self._event.set()
        self.spell = 0
        """Counts idle spells: ``on_idle(spell)`` should act only while ``still_idle(spell)``."""
        self.timer: threading.Timer | None = None

    def busy(self) -> None:
        self._event.clear()

    def idle(self, delay_s: float | None) -> None:
        """A new idle spell: arm its release after ``delay_s`` (None: none, the owner is closed), cancelling the
        last one's, then wake whoever waits for idle, who thus finds the release already pending."""
        self.spell += 1
        if self.timer is not None:  # one pending release at a time, not a thread per idle spell
            self.timer.cancel()
            self.timer = None
        if delay_s is not None:
            self.timer = threading.Timer(delay_s, self._on_idle, args=(self.spell,))
            self.timer.daemon = True
            self.timer.start()
        self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def still_idle(self, spell: int) -> bool:
        return self._event.is_set() and spell == self.spell

    def close(self) -> None:
        """Cancel the pending release and wait for its thread: until it ends, it holds ``on_idle``'s owner (an
        engine, and through it a policy's model) alive."""
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join(1.0)
