"""A worker lost mid-stream: its request goes to another worker, whose reader needs the
request's stream from its start, though the chunks the lost worker read are gone from
the broker. The caller's sender starts the stream over in a new round (a seekable
source rewound, a short one from its copy; ``holdfast.sdk.rpc.chunks``, "Rounds"), so
the call completes with every byte read once by the new worker (checked by digest);
or, when the source can do neither, the call fails with ``StreamError`` at once, not
after the new reader's 30 s stall.

The workers are processes (``tests.rpc.stream_main``): the first hangs once it has
read part of the stream (``--stop-at``) and is killed there with SIGKILL; the second
starts after it. The caller runs here, on either front-end.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import threading
import time
from collections.abc import AsyncIterator

import pytest

from holdfast.sdk import Reply, Session, StreamError, aio
from tests.rpc.stream_main import MB, Pattern
from tests.rpc.test_stream_memory import End
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, unique_uri

READ_BEFORE_LOST = 6 * MB
"""What the first worker reads before it is lost: more than a sender's copy (4 MiB)."""
SHORT = 3 * MB + MB // 2
"""A stream within a sender's copy: 14 chunks of 256 KiB, of 16."""
SHORT_READ_BEFORE_LOST = 2 * MB + MB // 2
"""What the first worker reads of ``SHORT``: 10 chunks, past its window of 8, so the
broker has its CONFIRMs of the first 8 (a reader gets no ninth chunk before) and the
second worker cannot find them."""


class Unseekable:
    """A binary readable that cannot seek (a pipe, a socket)."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def read(self, size: int = -1) -> bytes:
        return self._data.read(size)


def pattern(size: int) -> bytes:
    """``size`` bytes whose every position matters to the digest."""
    return Pattern(size, 7).read(size) if size <= MB else b"".join(_blocks(size))


def _blocks(size: int) -> list[bytes]:
    source, blocks = Pattern(size, 7), []
    while block := source.read():
        blocks.append(block)
    return blocks


def call(address: str, uri: str, source: object, front_end: str) -> Reply:
    """One request with stream ``data`` from ``source``, on ``front_end``."""
    if front_end == "threaded":
        with Session(address, options=FAST) as session:
            return session.request(uri, b"", streams={"data": source}, timeout=120)  # type: ignore[dict-item]

    async def run() -> Reply:
        async with aio.Session(address, options=FAST) as session:
            return await session.request(uri, b"", streams={"data": source}, timeout=120)  # type: ignore[dict-item]

    return asyncio.run(run())


class LostWorker:
    """A first worker that hangs after reading ``stop_at`` bytes and is then killed,
    and a second one started after it; both stopped by PID."""

    def __init__(self, address: str, uri: str, flavour: str, stop_at: int) -> None:
        self._args = [address, uri, str(MB)] + (["--aio"] if flavour == "asyncio" else [])
        self.first = End("worker", *self._args, "--stop-at", str(stop_at))
        self.second: End | None = None
        self.first.wait_for("ready", 30)

    def lose_first(self) -> None:
        """Wait until the first worker has read its part, kill it, start the second."""
        assert self.first.wait_for("delivery", 60) == "delivery 1"
        self.first.wait_for("stopped", 60)
        self.first.stop()
        self.second = End("worker", *self._args)
        self.second.wait_for("ready", 30)

    def close(self) -> None:
        self.first.stop()
        if self.second is not None:
            self.second.stop()


def run_with_a_lost_worker(
    flavour: str, front_end: str, source: object, stop_at: int
) -> tuple[Reply | BaseException, LostWorker, float]:
    """The call's outcome while its first worker is lost, and the seconds from the
    second worker's start to the outcome."""
    uri = unique_uri("streams-worker-lost")
    outcome: list[Reply | BaseException] = []
    with BrokerProcess(["--store", "memory"]) as broker:
        workers = LostWorker(broker.address, uri, flavour, stop_at)
        try:

            def caller() -> None:
                try:
                    outcome.append(call(broker.address, uri, source, front_end))
                except BaseException as error:
                    outcome.append(error)

            thread = threading.Thread(target=caller, daemon=True)
            thread.start()
            workers.lose_first()
            started = time.monotonic()
            thread.join(120)
            assert outcome, "the call did not end within 120 s"
            return outcome[0], workers, time.monotonic() - started
        finally:
            workers.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("front_end", ["threaded", "asyncio"])
@pytest.mark.parametrize("flavour", ["threaded", "asyncio"])
def test_a_seekable_stream_is_sent_again_to_the_worker_that_takes_over(
    flavour: str, front_end: str
) -> None:
    data = pattern(24 * MB)
    outcome, workers, _ = run_with_a_lost_worker(
        flavour, front_end, io.BytesIO(data), READ_BEFORE_LOST
    )
    assert isinstance(outcome, Reply), outcome
    assert outcome.payload.decode() == f"{len(data)}:{hashlib.sha256(data).hexdigest()}"
    assert workers.second is not None  # it ran the request, and the first did not finish
    assert "delivery 2" in workers.second.seen and "stopped" in workers.first.seen


@pytest.mark.timeout(180)
@pytest.mark.parametrize("front_end", ["threaded", "asyncio"])
def test_a_stream_sent_to_its_end_before_its_worker_was_lost_is_sent_again(
    front_end: str,
) -> None:
    # The first worker reads every byte, so its caller's sender has posted the end and
    # waits only for a new round: the sender's state after a whole stream.
    data = pattern(8 * MB)
    outcome, workers, _ = run_with_a_lost_worker("threaded", front_end, io.BytesIO(data), len(data))
    assert isinstance(outcome, Reply), outcome
    assert outcome.payload.decode() == f"{len(data)}:{hashlib.sha256(data).hexdigest()}"
    assert workers.second is not None and "delivery 2" in workers.second.seen


@pytest.mark.timeout(180)
@pytest.mark.parametrize("front_end", ["threaded", "asyncio"])
def test_a_short_stream_that_cannot_seek_is_sent_again_from_the_senders_copy(
    front_end: str,
) -> None:
    data = pattern(SHORT)
    outcome, _, _ = run_with_a_lost_worker(
        "threaded", front_end, Unseekable(data), SHORT_READ_BEFORE_LOST
    )
    assert isinstance(outcome, Reply), outcome
    assert outcome.payload.decode() == f"{len(data)}:{hashlib.sha256(data).hexdigest()}"


async def _pieces(data: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(data), 256 * 1024):
        yield data[start : start + 256 * 1024]


@pytest.mark.timeout(180)
def test_a_short_async_iterable_is_sent_again_from_the_senders_copy() -> None:
    data = pattern(SHORT)
    outcome, _, _ = run_with_a_lost_worker(
        "asyncio", "asyncio", _pieces(data), SHORT_READ_BEFORE_LOST
    )
    assert isinstance(outcome, Reply), outcome
    assert outcome.payload.decode() == f"{len(data)}:{hashlib.sha256(data).hexdigest()}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("front_end", ["threaded", "asyncio"])
def test_a_long_stream_that_cannot_seek_fails_the_call_at_once(front_end: str) -> None:
    data = pattern(24 * MB)
    outcome, _, seconds = run_with_a_lost_worker(
        "threaded", front_end, Unseekable(data), READ_BEFORE_LOST
    )
    assert isinstance(outcome, StreamError), outcome
    assert "cannot be read again" in str(outcome)
    assert seconds < 20  # not the new reader's stall (30 s), nor the call's timeout
