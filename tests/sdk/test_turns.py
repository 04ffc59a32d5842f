"""``holdfast.sdk.turns``: how many turns of the loop a woken writer lets run first.

The figures are the module's documented ones (64 KiB, two extra turns), written out:
a test that read them from the module would pass whatever they became."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.sdk.turns import before_taking

pytestmark = pytest.mark.timeout(30)


async def steps_run_before_taking(last_write_bytes: int, chain: int) -> tuple[int, float]:
    """Start a chain of ``chain`` callbacks, each scheduling the next on the following
    turn (frames gRPC hands over one by one); how many ran before the writer took,
    and the loop time that took."""
    loop = asyncio.get_running_loop()
    ran = 0

    def step() -> None:
        nonlocal ran
        ran += 1
        if ran < chain:
            loop.call_soon(step)

    loop.call_soon(step)
    started = loop.time()
    await before_taking(last_write_bytes)
    return ran, loop.time() - started


@pytest.mark.parametrize("last", [0, 100, 64 * 1024 - 1])
def test_a_writer_of_small_messages_lets_ready_callbacks_run_two_more_turns(last: int) -> None:
    ran, took = asyncio.run(steps_run_before_taking(last, chain=50))
    assert ran == 3  # the first turn and two more
    assert took < 0.5  # turns, not sleeps


@pytest.mark.parametrize("last", [64 * 1024, 1 << 20])
def test_a_writer_of_big_messages_waits_one_turn(last: int) -> None:
    ran, took = asyncio.run(steps_run_before_taking(last, chain=50))
    assert ran == 1
    assert took < 0.5


def test_extra_turns_stop_when_the_burst_is_over() -> None:
    assert asyncio.run(steps_run_before_taking(100, chain=2))[0] == 2
