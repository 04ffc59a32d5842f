"""Bounded waits for tests: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout: float, what: str = "condition") -> None:
    """Poll ``condition`` every 10 ms; raise ``AssertionError`` if it is still false after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


async def wait_until_async(
    condition: Callable[[], object], timeout: float, what: str = "condition"
) -> None:
    """``wait_until`` on an event loop: poll every 10 ms without blocking the loop."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)
