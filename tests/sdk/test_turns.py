"""``holdfast.sdk.turns``: how many turns of the loop a woken writer lets run first."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.sdk.turns import EXTRA_TURNS, SMALL_WRITE_BYTES, before_taking

pytestmark = pytest.mark.timeout(30)


async def steps_run_before_taking(last_write_bytes: int, chain: int) -> int:
    """Start a chain of ``chain`` callbacks, each scheduling the next on the following
    turn (frames gRPC hands over one by one); how many ran before the writer took."""
    loop = asyncio.get_running_loop()
    ran = 0

    def step() -> None:
        nonlocal ran
        ran += 1
        if ran < chain:
            loop.call_soon(step)

    loop.call_soon(step)
    await before_taking(last_write_bytes)
    return ran


def test_a_writer_of_small_messages_lets_ready_callbacks_run_for_extra_turns() -> None:
    assert EXTRA_TURNS >= 1
    ran = asyncio.run(steps_run_before_taking(100, chain=50))
    assert ran == 1 + EXTRA_TURNS  # the first turn and the extra ones


def test_a_writer_of_big_messages_waits_one_turn() -> None:
    ran = asyncio.run(steps_run_before_taking(SMALL_WRITE_BYTES, chain=50))
    assert ran == 1


def test_extra_turns_stop_when_the_burst_is_over() -> None:
    assert asyncio.run(steps_run_before_taking(100, chain=2)) == 2
