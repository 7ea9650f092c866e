"""The run's rollout thread: one persistent asyncio event loop in a daemon thread, where every rollout and
evaluation of a training run plays.

One loop for the whole run keeps loop-bound clients valid (``OpenAIPolicy``'s connection pool, ``HFPolicy``'s
batcher), and a thread of its own lets the trainer's main thread update the model while the next step's
episodes play (``rollout.async_rollout``): ``submit`` returns at once, ``run`` waits.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class RolloutLoop:
    """An event loop running in its own daemon thread until ``close``."""

    def __init__(self, name: str = "taskrl-rollouts") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Start ``coro`` on the loop; the future holds its result (or its exception)."""
        if self.loop.is_closed():
            coro.close()
            raise RuntimeError("the rollout loop is closed; create a new Trainer")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it; an interrupt of the waiting thread cancels it."""
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel whatever still runs, stop the loop and join its thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout_s)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()
