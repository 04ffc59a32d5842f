"""The dispatcher thread lets the other threads run during a long batch of callbacks
(``holdfast.sdk.dispatch.YIELD_EVERY``): a consumer's CONFIRMs leave while it is still
running the callbacks of the same PUSH batch, so the broker can PUSH more meanwhile."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from holdfast.sdk.dispatch import YIELD_EVERY, Dispatcher

pytestmark = pytest.mark.timeout(60)

CALLBACKS = 1000 * YIELD_EVERY


@pytest.fixture
def slow_switching() -> Iterator[None]:
    """The interpreter asks a busy thread for the lock only every 5 s: whatever
    another thread gets to do during a batch, the dispatcher gave it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_another_thread_runs_before_a_long_batch_of_callbacks_ends(
    slow_switching: None,
) -> None:
    ran: list[int] = []
    started, seen = threading.Event(), threading.Event()
    observed: list[int] = []

    def watcher() -> None:  # as the sending thread, woken by the first CONFIRM
        started.wait(30)
        observed.append(len(ran))
        seen.set()

    def callback(index: int) -> None:
        ran.append(index)
        if index == 0:
            started.set()

    thread = threading.Thread(target=watcher)
    thread.start()
    dispatcher = Dispatcher("test-dispatch")
    try:
        dispatcher.submit([(callback, i) for i in range(CALLBACKS)])
        assert seen.wait(30)
        assert dispatcher.barrier(30)
    finally:
        dispatcher.stop(5)
        thread.join(5)
    assert ran == list(range(CALLBACKS))  # in order, each once
    assert observed[0] < CALLBACKS, "the watcher ran only after the whole batch"
