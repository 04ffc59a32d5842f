"""A coroutine that awaits ``post()`` in a loop lets the writer run: every
``YIELD_EVERY`` posts queued for it, a post first gives the loop one turn
(``holdfast.sdk.driver.aio``). Without it the loop never suspends while nothing
pushes back, and every PUT waits for the loop's end."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import ack_batch, read_puts
from holdfast.sdk import aio
from holdfast.sdk.driver.aio import YIELD_EVERY
from holdfast.sdk.frames import MAX_PUTS_PER_FRAME
from tests.support.fake_broker import client_frames, handshake_answer

pytestmark = pytest.mark.timeout(30)

POSTS = 16 * YIELD_EVERY


class RecordingConnection:
    """A broker that answers Hello and OpenQueue, ACKs every PUT, and records how many
    ``post()`` calls had returned when each PUT was sent."""

    def __init__(self) -> None:
        self.inbound: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.posted = 0
        """Set by the test as its posts return."""
        self.puts_sent_at: list[int] = []
        self.put_frames = 0
        self.payloads: list[bytes] = []

    async def send(self, data: bytes) -> None:
        for frame in client_frames(data):
            answer = handshake_answer(frame)
            if answer is not None:
                self.inbound.put_nowait(answer)
            elif frame.WhichOneof("frame") == "puts":
                puts = read_puts(frame.puts)
                self.put_frames += 1
                self.payloads += puts.payloads
                self.puts_sent_at += [self.posted] * len(puts.guids)
                acks = ack_batch(
                    [
                        (queue_id, guid, pb.STATUS_OK)
                        for queue_id, guid in zip(puts.queue_ids, puts.guids, strict=True)
                    ]
                )
                self.inbound.put_nowait(pb.ServerFrame(acks=acks).SerializeToString())

    async def receive(self) -> bytes | None:
        return await self.inbound.get()

    async def finish(self) -> None:
        self.inbound.put_nowait(None)

    async def close(self) -> None:
        self.inbound.put_nowait(None)


class RecordingTransport:
    def __init__(self) -> None:
        self.connection = RecordingConnection()

    async def connect(self, address: str) -> RecordingConnection:
        return self.connection


async def tight_loop() -> tuple[list[int], int]:
    transport = RecordingTransport()
    async with aio.Session("scripted:1", transport=transport) as session:
        queue = await session.open_queue("hf://test/turns", write=True)
        for _ in range(POSTS):
            await queue.post(b"x")  # nothing else in the loop awaits
            transport.connection.posted += 1
        return transport.connection.puts_sent_at, transport.connection.put_frames


def test_a_loop_of_awaited_posts_lets_its_puts_leave_while_it_runs() -> None:
    sent_at, frames = asyncio.run(tight_loop())
    during = [posted for posted in sent_at if posted < POSTS]
    # Most PUTs left while the loop ran. The writer, woken by the first post, needs a
    # few turns of its own before it takes (here four: 2,048 PUTs a frame), so the
    # bound leaves it eight; before the turns every PUT left after the loop's end.
    assert len(during) >= POSTS // 2, (len(during), sent_at[:3], sent_at[-3:])
    assert sent_at[0] <= POSTS // 2
    # A turn once every YIELD_EVERY posts, not at every post: frames stay large.
    assert frames <= POSTS // YIELD_EVERY, frames


async def cancelled_at_the_turn() -> int:
    transport = RecordingTransport()
    async with aio.Session("scripted:1", transport=transport) as session:
        queue = await session.open_queue("hf://test/turns", write=True)

        async def burst() -> None:
            for _ in range(YIELD_EVERY + 1):  # the last post takes its turn first
                await queue.post(b"x")

        task = asyncio.get_running_loop().create_task(burst())
        await asyncio.sleep(0)  # the burst runs up to that turn and waits there
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await queue.post(b"y")  # the next post goes ahead
        assert await session.flush(10)
    return len(transport.connection.puts_sent_at)


def test_a_post_cancelled_at_its_turn_has_queued_nothing() -> None:
    assert asyncio.run(cancelled_at_the_turn()) == YIELD_EVERY + 1


async def many_tasks() -> list[bytes]:
    transport = RecordingTransport()
    async with aio.Session("scripted:1", transport=transport) as session:
        queue = await session.open_queue("hf://test/turns", write=True)

        async def one_post(index: int) -> None:
            await queue.post(b"%d" % index)

        # Woken together (as a request/reply caller's calls by a frame of replies),
        # more than YIELD_EVERY tasks post once each, in turn: none takes a turn (it
        # would put its PUT behind the others', and split their frames).
        await asyncio.gather(*(one_post(index) for index in range(MAX_PUTS_PER_FRAME)))
        assert await session.flush(10)
    return transport.connection.payloads


def test_posts_of_many_tasks_in_turn_take_no_turn() -> None:
    assert asyncio.run(many_tasks()) == [b"%d" % index for index in range(MAX_PUTS_PER_FRAME)]


async def finished_poster_alive() -> bool:
    transport = RecordingTransport()
    async with aio.Session("scripted:1", transport=transport) as session:
        queue = await session.open_queue("hf://test/turns", write=True)

        async def one_post() -> None:
            await queue.post(b"x")

        task = asyncio.get_running_loop().create_task(one_post())
        await task
        finished = weakref.ref(task)
        del task
        await asyncio.sleep(0)  # the wake-up that resumed this coroutine let go of it
        gc.collect()
        alive = finished() is not None
        assert await session.flush(10)
    return alive


def test_the_turn_count_keeps_no_finished_task_alive() -> None:
    assert not asyncio.run(finished_poster_alive())
