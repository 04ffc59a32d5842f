"""The asyncio pump: drives a ``DriverCore`` on an event loop (the proxy's upstream).

One task runs the connections (failing over with back-off) and reads frames
into the engine; per connection a writer task sends batched frames and runs the
engine's timers while it waits. Everything runs on the loop, so no locks, and
the engine's outputs are routed at once: PUT outcomes to ``on_wire_acks``,
callbacks called inline, request completions settle their futures.

Any exception in a connection ends that connection (see
``holdfast.sdk.driver.core``), never the task; a failure outside any connection
fails the session, so no request and no caller waits forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from holdfast.sdk.driver.core import CLOSE_DRAIN_TIMEOUT, DriverCore
from holdfast.sdk.engine import SessionEngine, WireAck
from holdfast.sdk.errors import HoldfastError, RemoteProtocolError, TransportError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.transports.base import AsyncConnection, AsyncTransport
from holdfast.sdk.turns import before_taking

log = logging.getLogger("holdfast.sdk.driver")

YIELD_EVERY = 512
"""PUTs one task may queue in a row, while the writer has not taken them, before its
next post lets the loop run once (``turn_due``). A coroutine that awaits ``post()`` in
a loop never suspends while nothing pushes back, so without it the writer, the reader
and every ACK callback wait until that loop ends: a burst of 200k posts left in 3
frames at its end (PUT->ACK p50 0.9 s). With a turn every 512 the same burst runs at
1.4x the rate, p50 12-16 ms (``bench/PROFILE.md``, "A tight loop of awaited posts");
every 128 made smaller frames and cost more a message. Posts of many tasks in turn (a
request/reply caller's calls) never take one: there the turns split frames and cost
5-10 % of a call."""


class AsyncDriver:
    """Runs one engine's connections on the running event loop."""

    def __init__(
        self,
        engine: SessionEngine,
        addresses: list[str],
        options: SessionOptions,
        transport: AsyncTransport,
        on_wire_acks: Callable[[list[WireAck]], Any] | None = None,
    ) -> None:
        self.engine = engine
        self.core = DriverCore(engine, addresses, options, log)
        self._transport = transport
        self._on_wire_acks = on_wire_acks
        self._requests: dict[int, asyncio.Future[None]] = {}
        self._outbound_ready = asyncio.Event()
        self._changed = asyncio.Event()
        self._poster = 0
        """``id()`` of the task that posted last: an id, not the task, so that a finished
        task is not kept alive (an id reused by a later task only counts on)."""
        self._in_a_row = 0
        """PUTs ``_poster`` queued in a row since the writer last took (``YIELD_EVERY``)."""
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        """Set by ``start``. Tasks are asked for by the loop object: without one,
        ``asyncio.current_task()`` is a ``getpid()`` system call on Python 3.11."""
        self._connection: AsyncConnection | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start connecting (on the running loop)."""
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    async def stop(self) -> None:
        """End the stream after what is queued, then close the engine (pending PUTs are
        reported UNKNOWN) and the connection."""
        self.core.begin_stop()
        task = self._task
        if (
            task is not None
            and not task.done()
            and task is not asyncio.current_task()  # a callback of this task closing
            and self._connection is not None
        ):
            # The writer sends what is queued (CONFIRMs issued before close()) and
            # half-closes; the broker reads all of it, then ends the stream, and the
            # connection task returns. Cancelling at once could discard frames it had
            # not read yet, and the broker would redeliver confirmed messages.
            self._outbound_ready.set()
            await asyncio.wait({task}, timeout=CLOSE_DRAIN_TIMEOUT)
        self.engine.close()
        self.after_input()
        if self._connection is not None:
            await self._connection.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # ------------------------------------------------------------------ used by the front-end

    def after_input(self) -> None:
        """Route PUT outcomes, run callbacks and settle completions (outcomes first:
        a close is answered after the ACKs of the PUTs posted before it)."""
        engine = self.engine
        acks = engine.take_wire_acks()
        if acks and self._on_wire_acks is not None:
            try:
                self._on_wire_acks(acks)
            except Exception:
                log.exception("routing PUT outcomes raised; continuing")
        for function, argument in engine.take_callbacks():
            try:
                function(argument)
            except Exception:
                log.exception("a session callback raised; continuing")
        for request_id, error in engine.take_completions():
            future = self._requests.get(request_id)
            if future is not None and not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        if engine.has_outbound or engine.next_deadline() is not None:
            self._outbound_ready.set()  # the writer takes new items or a new timer
        self._changed.set()

    def outbound_queued(self) -> None:
        """The front-end queued something for the wire (a PUT, a CONFIRM)."""
        self._outbound_ready.set()

    def turn_due(self, puts: int = 1) -> bool:
        """Whether the running task, about to queue ``puts`` PUTs, should first let the
        loop run (``await asyncio.sleep(0)``): once each time it has queued
        ``YIELD_EVERY`` in a row that the writer has not taken. Asked before queueing,
        so that a cancel at that turn leaves nothing queued."""
        task = id(asyncio.current_task(self._loop))
        if task != self._poster:
            self._poster, self._in_a_row = task, 0
        self._in_a_row += puts
        if self._in_a_row <= YIELD_EVERY:
            return False
        self._in_a_row = puts
        return True

    async def wait_request(self, request_id: int, timeout: float, what: str) -> None:
        """Wait for a request the engine just queued; raise its error or a timeout."""
        future = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        self.after_input()
        try:
            await asyncio.wait_for(future, timeout)
        except HoldfastError:
            raise  # the request's own error (some, like BrokerUnreachableError, are TimeoutErrors)
        except TimeoutError:
            raise self.core.timed_out(what, timeout) from None
        finally:
            self._requests.pop(request_id, None)

    async def wait_changed(self, timeout: float | None = None) -> None:
        """Wait until the next input has been processed (or ``timeout`` seconds)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)

    # ------------------------------------------------------------------ the connection task

    async def _run(self) -> None:
        try:
            while (address := self.core.begin(time.monotonic())) is not None:
                self.after_input()
                delay = await self._run_connection(address, self.core.generation)
                self.after_input()
                if delay is None:
                    return
                await self._back_off(delay)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug here must fail the session, not end the task silently
            self.core.fail(exc)
            self.after_input()

    async def _back_off(self, delay: float) -> None:
        deadline = time.monotonic() + delay
        while (now := time.monotonic()) < deadline and not self.core.stopping:
            ticked, timer = self.core.run_timers(now)
            if ticked:
                self.after_input()
            await asyncio.sleep(deadline - now if timer is None else min(deadline - now, timer))

    async def _run_connection(self, address: str, generation: int) -> float | None:
        """Run one connection until it ends; the back-off before the next, or None to stop."""
        error: BaseException | None = None
        writer: asyncio.Task[None] | None = None
        connection: AsyncConnection | None = None
        try:
            connection = await self._transport.connect(address)
            self._connection = connection
            writer = asyncio.get_running_loop().create_task(self._write(connection, generation))
            while True:
                # Reads are only timed during the handshake: cancelling a read later
                # could lose the frame it was receiving.
                timeout = self.core.hello_remaining(time.monotonic())
                try:
                    data = await asyncio.wait_for(connection.receive(), timeout)
                except TimeoutError:
                    self.core.expire_hello()
                    break
                if data is None:
                    break
                self.core.receive(generation, data, time.monotonic())
                self.after_input()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this task is being cancelled (the session stops)
            # grpc.aio raises CancelledError from a read whose call was cancelled under
            # it: the writer closed the connection on an error, reported below. Raised
            # on, it would end this task silently and leave the session dead.
            error = RemoteProtocolError("the connection was closed under its reader")
        except Exception as exc:
            error = exc
        finally:
            if writer is not None and writer.done() and not writer.cancelled():
                error = writer.exception() or error
            if writer is not None:
                writer.cancel()
            self._connection = None
            if connection is not None:
                with contextlib.suppress(Exception):
                    await connection.close()
        return self.core.ended(error)

    async def _write(self, connection: AsyncConnection, generation: int) -> None:
        """Send what the engine queues, batched; ``send`` waits on flow control, and
        meanwhile PUTs pile up and count against the high watermark. Runs the
        engine's timers while idle. An error here ends the connection."""
        engine = self.engine
        last_bytes = 0
        try:
            while engine.generation == generation:
                if not engine.has_outbound:
                    if self.core.stopping:
                        await connection.finish()  # everything queued has left
                        return
                    self._outbound_ready.clear()
                    ticked, timer = self.core.run_timers(time.monotonic())
                    if ticked:
                        self.after_input()
                        continue
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._outbound_ready.wait(), timer)
                    await before_taking(last_bytes)  # small frames leave together
                    continue
                self._in_a_row = 0
                for frame, nbytes in self.core.frames(engine.take_outbound(), time.monotonic()):
                    last_bytes = len(frame)
                    await connection.send(frame)
                    engine.transport_drained(nbytes)
                    self._changed.set()
        except TransportError:
            return  # the reader sees the stream fail and reports why
        except Exception:
            # Not the link: end the connection (the reader's receive ends with it) and
            # let the reader report this as the cause.
            await connection.close()
            raise
