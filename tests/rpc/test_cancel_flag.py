"""``Request.cancelled`` (``CancelFlag``): a ``threading.Event`` made only on ``wait``,
that never misses a ``set`` however the two race."""

from __future__ import annotations

import threading
import time

import pytest

from holdfast.sdk.rpc.cancel import CancelFlag
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def test_is_set_and_wait_after_set() -> None:
    flag = CancelFlag()
    assert not flag.is_set()
    flag.set()
    assert flag.is_set()
    assert flag.wait(0) is True


def test_wait_times_out_while_not_set() -> None:
    flag = CancelFlag()
    started = time.monotonic()
    assert flag.wait(0.05) is False
    assert time.monotonic() - started >= 0.04


def test_a_waiting_thread_is_woken_by_set() -> None:
    flag = CancelFlag()
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(flag.wait(30)))
    waiter.start()
    # Once the waiter made its Event it waits on it (the path a set() must wake).
    wait_until(lambda: flag._event is not None, 10, "the waiter's Event")
    flag.set()
    waiter.join(30)
    assert woken == [True]


class SetFirst:
    """A stand-in for ``CancelFlag._making`` that lets a ``set()`` from another thread
    run to its end just before the first waiter takes the lock: the interleaving in
    which a waiter that saw the flag clear makes its Event after the set."""

    def __init__(self, flag: CancelFlag) -> None:
        self._lock = threading.Lock()
        self._flag = flag
        self._fired = False

    def __enter__(self) -> None:
        if not self._fired:
            self._fired = True
            setter = threading.Thread(target=self._flag.set)
            setter.start()
            setter.join(10)
        self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


def test_a_set_between_the_check_and_the_events_making_is_not_missed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flag = CancelFlag()
    monkeypatch.setattr(CancelFlag, "_making", SetFirst(flag))
    assert flag.wait(5) is True
