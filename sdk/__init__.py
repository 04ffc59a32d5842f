"""The Holdfast client SDK.

::

    from holdfast.sdk import Session, QueueOptions, AckStatus

    with Session("127.0.0.1:7701") as session:
        queue = session.open_queue("hf://demo/orders", write=True)
        guid = queue.post(b"payload", properties={"k": "v"}, on_ack=print)
        session.flush(timeout=30)

Modules, each with one job: ``engine`` (the HA rules, no I/O), ``session``
(threads and locking around the engine), ``transport`` (gRPC and its status
codes), ``frames`` (batching into wire frames), ``dispatch`` (the callback
thread), ``backoff``, ``queue``, ``types``, ``events``, ``options``, ``errors``.

``holdfast.sdk.spark`` (imported on its own, not from here) is the PySpark sink:
``df.foreachPartition(QueueSink(uri, run_id=...))`` and ``foreachBatch``, exactly
once under task retries thanks to deterministic GUIDs.
"""

from holdfast.sdk.errors import (
    BandwidthLimitError,
    BufferFullError,
    ConfirmDroppedError,
    FlowControlError,
    HoldfastError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    NotWritableError,
    PayloadTooLargeError,
    ProtocolVersionError,
    QueueNotOpenError,
    QueueStateError,
    RequestFailedError,
    RequestTimeoutError,
    RetryableTransportError,
    SessionClosedError,
    TerminalTransportError,
    TransportError,
)
from holdfast.sdk.events import (
    ConfirmRejected,
    ConnectAttemptFailed,
    Connected,
    ConnectionLost,
    QueueReopened,
    Reconnected,
    SessionClosed,
    SessionEvent,
    SessionFailed,
    StateRestored,
    log_event,
)
from holdfast.sdk.options import QueueOptions, ReconnectOptions, SessionOptions
from holdfast.sdk.queue import Queue
from holdfast.sdk.session import Session
from holdfast.sdk.types import Ack, AckStatus, Message

__all__ = [
    "Ack",
    "AckStatus",
    "BandwidthLimitError",
    "BufferFullError",
    "ConfirmDroppedError",
    "ConfirmRejected",
    "ConnectAttemptFailed",
    "Connected",
    "ConnectionLost",
    "FlowControlError",
    "HoldfastError",
    "InvalidArgumentError",
    "InvalidPropertiesError",
    "InvalidQueueUriError",
    "Message",
    "NotWritableError",
    "PayloadTooLargeError",
    "ProtocolVersionError",
    "Queue",
    "QueueNotOpenError",
    "QueueOptions",
    "QueueReopened",
    "QueueStateError",
    "ReconnectOptions",
    "Reconnected",
    "RequestFailedError",
    "RequestTimeoutError",
    "RetryableTransportError",
    "Session",
    "SessionClosed",
    "SessionClosedError",
    "SessionEvent",
    "SessionFailed",
    "SessionOptions",
    "StateRestored",
    "TerminalTransportError",
    "TransportError",
    "log_event",
]
