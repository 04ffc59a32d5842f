"""The toxics: what each one does to the bytes of one direction of one connection.

A ``Toxic`` is what the API shows (name, type, stream, toxicity, attributes).
Applied to a link (one direction of one proxied connection) it becomes a
``ToxicRun``: the link passes every chunk it reads through its runs in chain
order (``process`` may delay, split, drop or forward it) and, at end of stream,
calls every run's ``at_eof``. As in Toxiproxy, ``toxicity`` is the probability
that a toxic applies to a link, drawn once when it is attached; a run that lost
the draw passes everything through.

The semantics are Toxiproxy's (its README and ``toxics/*.go``):

- ``latency``: each chunk leaves ``latency`` +/- ``jitter`` ms after it was read
  (pipelined: chunks read together leave together);
- ``bandwidth``: at most ``rate`` KB/s (1 KB = 1000 bytes), large chunks sent in
  100 ms slices;
- ``timeout``: every byte is dropped; with ``timeout`` > 0 the connection closes
  after that many ms without data (each dropped chunk restarts the clock, as in
  Go), with 0 it stays open until the toxic is removed. Removing it closes the
  connections it held, since bytes were lost;
- ``reset_peer``: the first chunk is dropped and ``timeout`` ms later the
  connection is reset (SO_LINGER 0: both peers get an RST);
- ``limit_data``: ``bytes`` bytes pass, then the connection closes;
- ``slow_close``: the end of the stream is passed on ``delay`` ms late.

A run stopped mid-chunk (its toxic removed or updated) passes the chunk on
rather than drop it, like Toxiproxy's interrupted toxics.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

STREAMS = ("upstream", "downstream")
"""``upstream``: client to server bytes; ``downstream``: server to client bytes."""


class ApiError(Exception):
    """An error the API answers with HTTP ``status`` and ``{"error": ..., "status": ...}``."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class LinkEnded(Exception):
    """Raised through a link's pump by a run that ended the connection."""


@dataclass(slots=True)
class Chunk:
    """Bytes read from one side, with the loop time they were read (latency counts
    from there, so a backlog is not delayed twice)."""

    data: bytes
    timestamp: float


Forward = Callable[[Chunk], Awaitable[None]]
"""Passes a chunk to the rest of the chain (and finally to the destination)."""


class Control(Protocol):
    """What a run may do to the connection it belongs to."""

    def close(self) -> None:
        """Close both sides gracefully (what is written is still delivered)."""

    def reset(self) -> None:
        """Reset both sides: SO_LINGER 0, so each peer gets an RST."""


@dataclass
class Toxic:
    """A toxic as the API shows it; ``attributes`` are complete and validated."""

    name: str
    type: str
    stream: str
    toxicity: float
    attributes: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The toxic's JSON object, as Toxiproxy returns it."""
        return {
            "name": self.name,
            "type": self.type,
            "stream": self.stream,
            "toxicity": self.toxicity,
            "attributes": dict(self.attributes),
        }


class ToxicRun:
    """One toxic applied to one link. Subclasses override ``process`` and friends."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {}
    """The toxic's attributes and their defaults."""
    BUFFER: ClassVar[int] = 1
    """Chunks the link may read ahead of its pump while this run applies."""

    def __init__(self, toxic: Toxic, control: Control) -> None:
        self.toxic = toxic
        self.attributes = dict(toxic.attributes)
        self.control = control
        self.loop = asyncio.get_running_loop()
        # random() < 1.0 always holds, and < 0.0 never: toxicity 1 and 0 are exact.
        self.active = random.random() < toxic.toxicity
        self.stopped = asyncio.Event()

    def start(self) -> None:
        """The run joined its link's chain."""
        if self.active:
            self.on_start()

    def stop(self, *, removed: bool) -> None:
        """The run leaves the chain: its toxic was removed (``removed``), updated, or
        the connection ended. A sleep in progress ends at once."""
        if self.stopped.is_set():
            return
        self.stopped.set()
        if self.active:
            self.on_stop(removed=removed)

    async def handle(self, chunk: Chunk, forward: Forward) -> None:
        """Apply the toxic to ``chunk`` (or pass it on, if it does not apply)."""
        if self.active and not self.stopped.is_set():
            await self.process(chunk, forward)
        else:
            await forward(chunk)

    async def eof(self) -> None:
        """The source ended; return when the end may be passed on."""
        if self.active and not self.stopped.is_set():
            await self.at_eof()

    def inherit(self, previous: ToxicRun) -> None:
        """Take over the state of the run this one replaces (a toxic update)."""

    # -- what subclasses change ----------------------------------------------------

    def on_start(self) -> None:
        """Called once when an active run joins its chain."""

    def on_stop(self, *, removed: bool) -> None:
        """Called once when an active run leaves its chain."""

    async def process(self, chunk: Chunk, forward: Forward) -> None:
        """Do the toxic's work on one chunk; the default passes it on."""
        await forward(chunk)

    async def at_eof(self) -> None:
        """Do the toxic's work at the end of the stream; the default does nothing."""

    # -- helpers --------------------------------------------------------------------

    async def sleep(self, seconds: float) -> bool:
        """Sleep, unless the run is stopped meanwhile; True if it slept the whole time."""
        if seconds <= 0:
            return not self.stopped.is_set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopped.wait(), seconds)
        return not self.stopped.is_set()


class Latency(ToxicRun):
    """Delay every chunk by ``latency`` +/- ``jitter`` milliseconds."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {"latency": 0, "jitter": 0}
    # As Toxiproxy's latency buffer: reading ahead keeps the link pipelined.
    BUFFER: ClassVar[int] = 1024

    def delay(self) -> float:
        """This chunk's delay in seconds."""
        delay = self.attributes["latency"]
        jitter = self.attributes["jitter"]
        if jitter > 0:
            delay += random.randrange(-jitter, jitter)
        return max(delay, 0) / 1000.0

    async def process(self, chunk: Chunk, forward: Forward) -> None:
        """Hold the chunk until its delay has passed since it was read."""
        wait = self.delay() - (self.loop.time() - chunk.timestamp)
        if wait > 0 and await self.sleep(wait):
            chunk.timestamp += wait
        await forward(chunk)


class Bandwidth(ToxicRun):
    """Pass at most ``rate`` KB/s (0: no limit)."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {"rate": 0}

    def __init__(self, toxic: Toxic, control: Control) -> None:
        super().__init__(toxic, control)
        self._debt = 0.0
        """Seconds of sending the chunks passed so far still owe."""

    async def process(self, chunk: Chunk, forward: Forward) -> None:
        """Pace the chunk; one longer than 100 ms of rate goes in 100 ms slices."""
        rate = self.attributes["rate"]
        if rate <= 0:
            await forward(chunk)
            return
        self._debt += len(chunk.data) / (rate * 1000.0)
        data = chunk.data
        slice_bytes = rate * 100
        while len(data) > slice_bytes:
            if not await self.sleep(0.1):
                break  # stopped: the rest goes at once, nothing is dropped
            await forward(Chunk(data[:slice_bytes], chunk.timestamp))
            data = data[slice_bytes:]
            self._debt -= 0.1
        started = self.loop.time()
        await self.sleep(self._debt)
        # Over-sleeping is paid back by the next chunk, as in Toxiproxy.
        self._debt -= self.loop.time() - started
        await forward(Chunk(data, chunk.timestamp))


class Timeout(ToxicRun):
    """Drop every byte; close the connection after ``timeout`` ms without data
    (0: never)."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {"timeout": 0}

    def __init__(self, toxic: Toxic, control: Control) -> None:
        super().__init__(toxic, control)
        self._timer: asyncio.TimerHandle | None = None

    def on_start(self) -> None:
        """Start the clock (only when a timeout is set)."""
        self._arm()

    def on_stop(self, *, removed: bool) -> None:
        """Stop the clock; a removed black hole closes its connection (bytes were lost,
        as Toxiproxy's ``Cleanup`` does)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if removed:
            self.control.close()

    async def process(self, chunk: Chunk, forward: Forward) -> None:
        """Drop the chunk; data restarts the clock, as in Toxiproxy's select loop."""
        self._arm()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        timeout = self.attributes["timeout"]
        if timeout > 0:
            self._timer = self.loop.call_later(timeout / 1000.0, self.control.close)


class ResetPeer(ToxicRun):
    """On the first chunk, wait ``timeout`` ms, then reset the connection (RST)."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {"timeout": 0}

    async def process(self, chunk: Chunk, forward: Forward) -> None:
        """Drop the chunk and reset the connection (unless stopped meanwhile)."""
        if await self.sleep(self.attributes["timeout"] / 1000.0):
            self.control.reset()
            raise LinkEnded


class LimitData(ToxicRun):
    """Pass ``bytes`` bytes, then close the connection."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {"bytes": 0}

    def __init__(self, toxic: Toxic, control: Control) -> None:
        super().__init__(toxic, control)
        self.transmitted = 0

    def inherit(self, previous: ToxicRun) -> None:
        """An updated limit counts the bytes already passed (Toxiproxy keeps them)."""
        if isinstance(previous, LimitData):
            self.transmitted = previous.transmitted

    async def process(self, chunk: Chunk, forward: Forward) -> None:
        """Pass what is left of the allowance; close once it is used up."""
        remaining = max(self.attributes["bytes"] - self.transmitted, 0)
        if remaining:
            part = chunk.data[:remaining]
            await forward(Chunk(part, chunk.timestamp))
            self.transmitted += len(part)
        if self.transmitted >= self.attributes["bytes"]:
            self.control.close()
            raise LinkEnded


class SlowClose(ToxicRun):
    """Pass the end of the stream ``delay`` ms late."""

    ATTRIBUTES: ClassVar[dict[str, int]] = {"delay": 0}

    async def at_eof(self) -> None:
        """Hold the close."""
        await self.sleep(self.attributes["delay"] / 1000.0)


RUNS: dict[str, type[ToxicRun]] = {
    "latency": Latency,
    "bandwidth": Bandwidth,
    "timeout": Timeout,
    "reset_peer": ResetPeer,
    "limit_data": LimitData,
    "slow_close": SlowClose,
}
"""Every supported toxic type."""


def checked_attributes(
    kind: str, given: object, current: dict[str, int] | None = None
) -> dict[str, int]:
    """The complete attributes of a ``kind`` toxic: ``current`` (or the defaults)
    updated with ``given``. Unknown names are ignored, as Toxiproxy does; a value
    that is not a non-negative integer is refused (400)."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise ApiError("bad request body: attributes must be an object", 400)
    result = dict(RUNS[kind].ATTRIBUTES if current is None else current)
    for key, value in given.items():
        if key not in result:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ApiError(f"bad request body: {key} must be a non-negative integer", 400)
        result[key] = value
    return result


def checked_toxicity(value: object) -> float:
    """A toxicity in [0, 1] (400 otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ApiError("bad request body: toxicity must be a number in [0, 1]", 400)
    return float(value)


def new_toxic(body: object) -> Toxic:
    """Build a toxic from a create request, with Toxiproxy's defaults and errors."""
    if not isinstance(body, dict):
        raise ApiError("bad request body", 400)
    kind = body.get("type")
    stream = body.get("stream") or "downstream"
    if stream not in STREAMS:
        raise ApiError("stream was invalid, can be either upstream or downstream", 400)
    if not isinstance(kind, str) or kind not in RUNS:
        raise ApiError("invalid toxic type", 400)
    name = body.get("name") or f"{kind}_{stream}"
    if not isinstance(name, str):
        raise ApiError("bad request body: name must be a string", 400)
    toxicity = checked_toxicity(body.get("toxicity", 1.0))
    return Toxic(name, kind, stream, toxicity, checked_attributes(kind, body.get("attributes")))
