"""The limits of the contract: their defaults (defined here and nowhere else), the
``Limits`` value a broker announces, and the HelloReply that carries them.

A broker announces its limits in ``HelloReply``; a proxy relays its upstream's; the
SDK checks every PUT against what it was told before the PUT leaves the process.
The broker's gRPC message limit is derived from the same value
(``Limits.max_frame_bytes``), so what gRPC lets through, what the broker announces
and what it enforces cannot disagree.

Frame sizes: every peer coalesces PUTs, ACKs or PUSHes into batch frames of a
target size of at most ``MAX_BATCH_BYTES`` and lets one larger message travel
alone, so no valid frame is bigger than a batch plus one maximal PUT. A broker
accepts exactly that; the SDK and the proxy, which bind or connect before they
learn a broker's limits, accept ``FRAME_CEILING``, and a broker refuses limits
whose frames would not fit under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from holdfast.proto import PROTOCOL_VERSION, pb

MIB = 1024 * 1024

MAX_APP_ID_BYTES = 1024
"""Longest application id of a commit mark (a Spark ``runId``; a query id plus a batch
id fits many times)."""

MAX_REJECT_DELAY_MS = 3_600_000
"""The longest reject delay (an hour): the SDK refuses a longer one, a broker cuts a
longer one it is sent to this, and a proxy relays at most this."""

MAX_AGE_MS = 2**53
"""The largest PUT age a hop relays (285,000 years, still exact as a float): any age
past a dedup window is TOO_OLD, and one near 2**64 would overflow the uint64 of the
next hop's frame once added to."""

DEFAULT_DEDUP_WINDOW = 300.0
"""Seconds a broker remembers an accepted GUID (BlazingMQ's ``deduplicationTimeMs``)."""

MAX_DEDUP_WINDOW = 30 * 86_400.0
"""The longest dedup window a broker takes: 30 days. The history holds every GUID of
the window (32 bytes each): at the default budget of 33M GUIDs a month of window is
full at 13 messages a second, so a longer one buys nothing but HISTORY_FULL. It is
far inside what the window travels and is timed in: the HelloReply's uint64 of
milliseconds (a window of 1e20 s did not fit: every session ended "Value out of
range"), PUT ages exact up to ``MAX_AGE_MS``, and the history's float seconds on a
monotonic clock, exact to the microsecond at this span."""

DEFAULT_MAX_PAYLOAD_BYTES = 4 * MIB
"""Largest payload one PUT may carry."""

DEFAULT_MAX_PROPERTIES = 64
"""Most properties one message may carry."""

DEFAULT_MAX_PROPERTIES_BYTES = 64 * 1024
"""Most bytes the properties of one message may take (see ``properties_size``)."""

DEFAULT_BATCH_BYTES = MIB
"""Default target size of one coalesced frame (PutBatch, AckBatch, PushBatch)."""

MAX_BATCH_BYTES = 8 * MIB
"""Largest batch target any peer may be configured with."""

FRAME_CEILING = 64 * MIB
"""Largest gRPC message the SDK and the proxy send or accept: they connect or bind
before a broker announces its limits, so no broker may announce limits whose
frames exceed this."""

DEFAULT_MAX_UNCONFIRMED_MESSAGES = 1000
"""A consumer's default flow limit: the broker stops PUSHing to it while it holds
this many unconfirmed messages (the SDK's ``QueueOptions`` default, and the broker's
when a request carries no ``QueueOptions``)."""

DEFAULT_MAX_UNCONFIRMED_BYTES = 32 * MIB
"""A consumer's default flow limit in unconfirmed payload bytes."""

PUT_WIRE_OVERHEAD = 64
"""Upper bound of the wire bytes of one PUT besides its payload and properties
(GUID, queue id, age, tags and lengths)."""

PROPERTY_WIRE_OVERHEAD = 16
"""Upper bound of the wire bytes of one property besides its key and value."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a broker accepts, as announced in ``HelloReply``. Checked on construction
    (``ValueError`` saying which value is wrong)."""

    dedup_window: float = DEFAULT_DEDUP_WINDOW
    """Seconds an accepted GUID is remembered; a PUT older than this is not retransmitted."""
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    """Largest payload; a bigger one is refused PAYLOAD_TOO_LARGE."""
    max_properties: int = DEFAULT_MAX_PROPERTIES
    """Most properties per message; more are refused INVALID_PROPERTIES."""
    max_properties_bytes: int = DEFAULT_MAX_PROPERTIES_BYTES
    """Most property bytes per message (UTF-8 keys plus values); more are refused."""

    def __post_init__(self) -> None:
        if not self.dedup_window > 0:
            raise ValueError(f"dedup_window must be > 0 seconds, not {self.dedup_window!r}")
        if self.max_payload_bytes <= 0:
            raise ValueError(f"max_payload_bytes must be > 0, not {self.max_payload_bytes}")
        if self.max_properties < 0:
            raise ValueError(f"max_properties must be >= 0, not {self.max_properties}")
        if self.max_properties_bytes < 0:
            raise ValueError(f"max_properties_bytes must be >= 0, not {self.max_properties_bytes}")
        if self.max_frame_bytes > FRAME_CEILING:
            raise ValueError(
                f"limits need frames of {self.max_frame_bytes} bytes, over the "
                f"{FRAME_CEILING} bytes every client accepts: lower max_payload_bytes "
                "or max_properties_bytes"
            )

    @property
    def max_put_bytes(self) -> int:
        """Wire size of the largest valid PUT (or PUSH) under these limits."""
        return (
            self.max_payload_bytes
            + self.max_properties_bytes
            + self.max_properties * PROPERTY_WIRE_OVERHEAD
            + PUT_WIRE_OVERHEAD
        )

    @property
    def max_frame_bytes(self) -> int:
        """Largest valid frame under these limits: a full batch plus one maximal PUT.
        A broker's gRPC send and receive limit."""
        return MAX_BATCH_BYTES + self.max_put_bytes


DEFAULT_LIMITS = Limits()
"""The defaults, also what the SDK assumes until a broker has announced its own."""


def hello_reply(session_id: str, limits: Limits, broker_id: str) -> pb.ServerFrame:
    """The ServerFrame answering a valid Hello: this protocol version and ``limits``.
    Built here only, for the broker and the proxy alike."""
    return pb.ServerFrame(
        hello_reply=pb.HelloReply(
            protocol_version=PROTOCOL_VERSION,
            session_id=session_id,
            dedup_window_ms=round(limits.dedup_window * 1000),
            max_payload_bytes=limits.max_payload_bytes,
            max_properties=limits.max_properties,
            max_properties_bytes=limits.max_properties_bytes,
            broker_id=broker_id,
            accepts_batches=True,
        )
    )


def limits_from_hello(reply: pb.HelloReply) -> Limits:
    """The limits a HelloReply announces; a size field left at 0 means the default.
    Raises ``ValueError`` for limits no client could work with (no window, frames
    over ``FRAME_CEILING``)."""
    return Limits(
        dedup_window=reply.dedup_window_ms / 1000.0,
        max_payload_bytes=reply.max_payload_bytes or DEFAULT_MAX_PAYLOAD_BYTES,
        max_properties=reply.max_properties or DEFAULT_MAX_PROPERTIES,
        max_properties_bytes=reply.max_properties_bytes or DEFAULT_MAX_PROPERTIES_BYTES,
    )
