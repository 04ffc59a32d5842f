"""``ReplyMemory``: a worker's kept replies, by the window and the bound, with an
injected clock; and ``Slots``, the asyncio worker's count of running handlers."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.sdk.aio.slots import Slots
from holdfast.sdk.rpc.replies import ReplyMemory


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_reply_is_kept_for_the_window_then_forgotten() -> None:
    clock = Clock()
    memory: ReplyMemory[str] = ReplyMemory(10, 300.0, clock)
    memory[b"a"] = "reply a"
    clock.now = 299.9
    assert memory.get(b"a") == "reply a"
    clock.now = 300.0
    assert memory.get(b"a") is None
    assert len(memory) == 0


def test_past_the_bound_the_oldest_go_first() -> None:
    memory: ReplyMemory[int] = ReplyMemory(3, 300.0, Clock())
    for i in range(5):
        memory[bytes([i])] = i
    assert [memory.get(bytes([i])) for i in range(5)] == [None, None, 2, 3, 4]


def test_a_reply_stored_again_keeps_its_newer_time() -> None:
    clock = Clock()
    memory: ReplyMemory[str] = ReplyMemory(10, 300.0, clock)
    memory[b"a"] = "first"
    clock.now = 200.0
    memory[b"a"] = "error reply"  # the reply could not be posted: an error reply instead
    clock.now = 350.0  # the first entry's time is past, the second's is not
    memory[b"b"] = "b"
    assert memory.get(b"a") == "error reply"
    clock.now = 500.0
    assert memory.get(b"a") is None


@pytest.mark.timeout(10)
def test_slots_let_at_most_count_run_and_wake_waiters_in_order() -> None:
    async def scenario() -> list[str]:
        slots = Slots(2)
        assert slots.take_now() and slots.take_now()
        assert not slots.take_now()
        order: list[str] = []

        async def waiter(name: str) -> None:
            await slots.take()
            order.append(name)

        first = asyncio.ensure_future(waiter("first"))
        second = asyncio.ensure_future(waiter("second"))
        await asyncio.sleep(0)
        assert not slots.take_now()  # waiters come first
        slots.give()
        await first
        slots.give()
        await second
        assert order == ["first", "second"]
        slots.give()
        slots.give()
        assert slots.take_now() and slots.take_now() and not slots.take_now()
        return order

    asyncio.run(scenario())


@pytest.mark.timeout(10)
def test_a_waiter_cancelled_as_it_is_handed_a_slot_passes_it_on() -> None:
    async def scenario() -> None:
        slots = Slots(1)
        assert slots.take_now()
        cancelled = asyncio.ensure_future(slots.take())
        after = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0)
        slots.give()  # handed to the first waiter...
        cancelled.cancel()  # ...which is cancelled before it runs
        await asyncio.gather(cancelled, return_exceptions=True)
        await asyncio.wait_for(after, 1)  # the slot went on to the next

    asyncio.run(scenario())
