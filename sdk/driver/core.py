"""The decisions of a session driver, with no I/O: what to do on connect, on each
frame, on a timer and when a connection ends.

The threaded driver (``holdfast.sdk.driver.threaded``, for ``Session``) and the
asyncio one (``holdfast.sdk.driver.aio``, for the proxy's upstream) differ only
in how they wait; both call this core under their own serialisation (a lock, or
the event loop), so failover, back-off, the Hello deadline, frame parsing,
batching and error containment are decided once.

Error containment: a frame that does not parse, or that the engine refuses with
``RemoteProtocolError``, and any unexpected exception in a pump end the
connection, never the thread or task. The driver logs one line and reconnects
with back-off; after ``MAX_BAD_CONNECTIONS`` connections in a row end that way
with no ACK or message accepted in between, or on a terminal transport error,
the session fails (``SessionFailed``; pending PUTs UNKNOWN, waiters failed). The
proxy's upstream session (``retry_refusals``) never fails that way: it logs the
error once and keeps trying with back-off, since it serves every client on its host
and a broker fixed or replaced behind the same address must find it working.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from google.protobuf.message import DecodeError

from holdfast.proto import pb
from holdfast.proto.batching import packed
from holdfast.sdk.engine import OutboundItem, SessionEngine
from holdfast.sdk.errors import (
    HoldfastError,
    RemoteProtocolError,
    RequestTimeoutError,
    SessionClosedError,
    TerminalTransportError,
    TransportError,
    UpstreamUnavailableError,
)
from holdfast.sdk.events import ConnectAttemptFailed
from holdfast.sdk.failover import FailoverPolicy
from holdfast.sdk.frames import encode
from holdfast.sdk.options import SessionOptions

MAX_BAD_CONNECTIONS = 3
"""Connections in a row ended by protocol or internal errors before the session fails."""

QUOTE_BYTES = 16
"""How much of an unparseable frame an error message quotes (hex)."""

ENDED_BY_SERVER = "the broker ended the stream"

CLOSE_DRAIN_TIMEOUT = 2.0
"""Seconds a driver's ``stop()`` lets the broker read what was sent (the CONFIRMs
issued before ``close()``) and end the stream before the stream is cancelled."""

_PROGRESS = ("acks", "pushes")
"""Frame kinds whose acceptance shows the server is working, not just answering."""


class DriverCore:
    """Connection decisions for one ``SessionEngine``; not thread-safe (the pump serialises)."""

    def __init__(
        self,
        engine: SessionEngine,
        addresses: list[str],
        options: SessionOptions,
        log: logging.Logger,
    ) -> None:
        self.engine = engine
        self.options = options
        self.stopping = False
        """Set by ``begin_stop``: connections that end now are not losses."""
        self.generation = 0
        self.address = ""
        self.established = False
        """Hello was answered on the current connection."""
        self._policy = FailoverPolicy(addresses, options.reconnect)
        self._log = log
        self._hello_deadline: float | None = None
        self._hello_expired = False
        self._bad_connections = 0
        self._failed_attempts = 0
        self._last_failure = ""

    def begin_stop(self) -> None:
        """The front-end's ``close()`` has begun: no connection is made again, and no
        CONFIRM is taken any more, as the writer ends the stream after what is queued."""
        self.stopping = True
        self.engine.begin_closing()

    # ------------------------------------------------------------------ a connection

    def begin(self, now: float) -> str | None:
        """Start a connection: the address to open, or None when the session is over."""
        if self.stopping:
            return None
        self.address = self._policy.current
        try:
            self.generation = self.engine.connection_made(self.address)
        except SessionClosedError:
            return None  # closed or failed meanwhile
        self.established = False
        self._hello_expired = False
        # A peer that accepts the connection but never answers Hello must not hold us.
        self._hello_deadline = now + self.options.connect_timeout
        return self.address

    def receive(self, generation: int, data: bytes, now: float) -> None:
        """Parse one raw server frame and feed it to the engine.

        Raises ``RemoteProtocolError`` for bytes that do not parse (or a frame the
        engine refuses): the pump then ends the connection.
        """
        try:
            frame = pb.ServerFrame.FromString(data)
        except DecodeError as exc:
            raise RemoteProtocolError(
                f"a server frame that does not parse ({len(data)} bytes, "
                f"starting {data[:QUOTE_BYTES].hex()}): {exc}"
            ) from exc
        kind = frame.WhichOneof("frame")
        if kind == "batch":
            # Frames handled one by one, as if each had come alone (a HelloReply or a
            # batch inside one is refused by the engine as an unknown or late frame).
            inner = frame.batch.frames
            for each in inner:
                if each.WhichOneof("frame") == "hello_reply":
                    raise RemoteProtocolError("the server sent a HelloReply inside a batch")
                self.engine.frame_received(generation, each, now)
            if any(each.WhichOneof("frame") in _PROGRESS for each in inner):
                kind = _PROGRESS[0]
        else:
            self.engine.frame_received(generation, frame, now)
        if self._bad_connections and kind in _PROGRESS:
            # Messages or ACKs flow again (a handshake and reopens alone do not count).
            self._bad_connections = 0
        if not self.established and self.engine.connected:
            self.established = True
            self._hello_deadline = None
            self._failed_attempts = 0

    def frames(self, items: Iterable[OutboundItem], now: float) -> Iterator[tuple[bytes, int]]:
        """Batch taken outbound items into raw frames, each with the bytes it accounts for;
        each PUT carries its age at ``now``.

        Pure: pumps call it outside their lock, on the writing thread or task. To a
        server that reads ``ClientFrames`` the frames of one take leave as one gRPC
        message (``holdfast.proto.batching``): a PutBatch and a ConfirmBatch together.
        """
        frames = (
            (frame.SerializeToString(), nbytes)
            for frame, nbytes in encode(items, self.options.max_batch_bytes, now)
        )
        if self.engine.peer_batches:
            yield from packed(frames, self.options.max_batch_bytes)
        else:
            yield from frames

    # ------------------------------------------------------------------ timers

    def hello_remaining(self, now: float) -> float | None:
        """Seconds left to answer Hello on the current connection (None once answered)."""
        if self._hello_deadline is None:
            return None
        return max(0.0, self._hello_deadline - now)

    def expire_hello(self) -> None:
        """The Hello deadline passed: the pump drops the connection."""
        if not self.established:
            self._hello_expired = True

    def run_timers(self, now: float) -> tuple[bool, float | None]:
        """Tick the engine if a timer of its is due. Returns whether it ticked (the pump
        then routes the outputs) and the seconds until the next timer (None: none)."""
        deadline = self.engine.next_deadline()
        ticked = deadline is not None and now >= deadline
        if ticked:
            self.engine.tick(now)
            deadline = self.engine.next_deadline()
        return ticked, None if deadline is None else max(0.0, deadline - now)

    # ------------------------------------------------------------------ the end of a connection

    def ended(self, error: BaseException | None) -> float | None:
        """The current connection ended (``error`` None: the server ended it cleanly).

        Returns the seconds to wait before the next attempt, or None when the
        session is over (closing, or failed now: pending PUTs are then UNKNOWN).
        """
        self._hello_deadline = None
        if self.stopping:
            return None
        if isinstance(error, TerminalTransportError):
            if self.engine.retry_refusals:  # the proxy's: tried again, as a failed attempt
                self._log.error("%s refused the session (trying again): %s", self.address, error)
            else:
                self._log.error("the connection to %s failed terminally: %s", self.address, error)
                self.engine.connection_lost(self.generation, str(error))
                self.engine.fail(error)
                return None
        reason, bad = self._reason(error)
        self.engine.connection_lost(self.generation, reason)
        if isinstance(error, UpstreamUnavailableError):
            self.engine.no_broker(f"{self.address}: {error}")
        counts_as_failure = not self.established
        if bad:
            self._bad_connections += 1
            if self._bad_connections <= MAX_BAD_CONNECTIONS:
                self._log.warning("dropped the connection to %s: %s", self.address, reason)
            if self._bad_connections >= MAX_BAD_CONNECTIONS:
                failure = RemoteProtocolError(
                    f"{self._bad_connections} connections in a row ended by errors "
                    f"with no ACK or message accepted in between; the last: {reason}"
                )
                if not self.engine.retry_refusals:
                    self.engine.fail(failure)
                    return None
                # The proxy's session serves every client on the host and must outlive
                # a bad broker (or a stray server on its address): it keeps trying,
                # backing off to its cap, and says so once until a connection works.
                if self._bad_connections == MAX_BAD_CONNECTIONS:
                    self._log.error("%s; still trying, with back-off", failure)
            counts_as_failure = True  # back off, and try the next address first
        delay = self._policy.connection_ended(not counts_as_failure)
        if not self.established:
            self._failed_attempts += 1
            self._last_failure = f"{self.address}: {reason}"
            self.engine.emit(ConnectAttemptFailed(self.address, reason, delay))
        return delay

    def timed_out(self, what: str, timeout: float) -> RequestTimeoutError:
        """The error of a request that got no answer in time, saying why if the link is
        down: "opening hf://d/q did not complete within 8 s: never connected to ..."."""
        why = self.why_not_connected()
        return RequestTimeoutError(
            f"{what} did not complete within {timeout:g} s" + (f": {why}" if why else "")
        )

    @property
    def failed_attempts(self) -> int:
        """Connection attempts that failed since the last Hello was answered."""
        return self._failed_attempts

    def why_not_connected(self) -> str | None:
        """Why the session has no live connection now, for the message of a request that
        timed out (None while connected): what the attempts since the last Hello saw."""
        if self.engine.connected:
            return None
        if not self._failed_attempts:
            return "connecting" if not self.engine.ever_connected else "reconnecting"
        attempts = f"{self._failed_attempts} attempt{'s' * (self._failed_attempts != 1)}"
        never = "never connected" if not self.engine.ever_connected else "not reconnected"
        addresses = ", ".join(self._policy.addresses)
        return f"{never} to {addresses} ({attempts}; the last, {self._last_failure})"

    def fail(self, error: BaseException) -> None:
        """A pump broke outside any connection: fail the session rather than hang it."""
        self._log.error("the session driver failed: %s: %s", type(error).__name__, error)
        cause = error if isinstance(error, HoldfastError) else HoldfastError(repr(error))
        self.engine.fail(cause)

    def _reason(self, error: BaseException | None) -> tuple[str, bool]:
        """Why the connection ended, and whether it was a protocol or internal error."""
        if self._hello_expired and (error is None or isinstance(error, TransportError)):
            return f"no answer to Hello within {self.options.connect_timeout} s", False
        if error is None:
            return ENDED_BY_SERVER, False
        if isinstance(error, TransportError):
            return str(error), False
        if isinstance(error, RemoteProtocolError):
            return f"protocol error: {error}", True
        return f"internal error: {type(error).__name__}: {error}", True
