"""The Holdfast client SDK.

::

    from holdfast.sdk import Session, QueueOptions, AckStatus

    with Session("127.0.0.1:7701") as session:
        queue = session.open_queue("hf://demo/orders", write=True)
        guid = queue.post(b"payload", properties={"k": "v"}, on_ack=print)
        session.flush(timeout=30)

Modules, each with one job: ``engine`` (the HA rules, no I/O; with ``state``,
``connection``, ``restore``, ``putbuffer`` (over ``putsegments``), ``producer``, ``consumer``,
``outbound``, ``queue_table``, ``outcomes`` and ``discovery``), ``driver`` (the one
connection driver: failover, back-off, the Hello deadline, reader and writer pumps),
``transports`` (sync gRPC, asyncio gRPC, in-memory), ``session`` (the synchronous
front-end), ``transport`` (gRPC channel options and the sorting of its status
codes), ``frames`` (batching into wire frames), ``dispatch`` (the callback thread),
``statuses`` (wire statuses to outcomes and errors), ``backoff``, ``queue``,
``types``, ``events``, ``options``, ``errors``; ``stats`` (``Session.stats()``:
``SessionStats``), ``inbox`` (the sync iterator ``queue.messages()``), ``tracing``
(the only module that imports OpenTelemetry, the ``[otel]`` extra), ``instrument``
(the front-ends' spans) and ``metrics`` (``stats()`` as OpenTelemetry metrics).

``rpc`` is request/reply over queues: ``session.request(uri, payload)``,
``session.request_async``, ``session.has_workers(uri)`` and ``Worker(session, uri,
handler)``; its errors are under ``RpcError``.

``holdfast.sdk.spark`` (imported on its own, not from here) is the PySpark
connector (``register(spark)``, then ``format("holdfast")``) and ``QueueSink`` for
``foreachPartition``/``foreachBatch``. ``marks`` serves ``Session.commit_mark``.
"""

import importlib
from typing import TYPE_CHECKING

from holdfast.proto.logs import quiet_library_logger
from holdfast.sdk.errors import (
    AlreadySettledError,
    AuthenticationError,
    BandwidthLimitError,
    BrokerBusyError,
    BrokerUnreachableError,
    BufferFullError,
    CallLostError,
    CommitMarkConflictError,
    ConfirmDroppedError,
    DeadLetteredError,
    FlowControlError,
    HoldfastError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    LimitExceededError,
    LocalProtocolError,
    NotWritableError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolError,
    ProtocolVersionError,
    QueueInUseError,
    QueueNotFoundError,
    QueueNotOpenError,
    QueueStateError,
    RemoteHandlerError,
    RemoteProtocolError,
    ReplyExpiredError,
    RequestFailedError,
    RequestRefusedError,
    RequestTimeoutError,
    RetryableTransportError,
    RpcCancelledError,
    RpcError,
    RpcTimeoutError,
    SessionClosedError,
    StreamError,
    StreamTakenError,
    TerminalTransportError,
    TransportError,
    UnknownRequestError,
    UnsupportedCallError,
    UpstreamUnavailableError,
    WorkerLostError,
    WorkerStartError,
)
from holdfast.sdk.events import (
    ConfirmRejected,
    ConnectAttemptFailed,
    Connected,
    ConnectionLost,
    DataLost,
    DeliveriesRevoked,
    QueueReopened,
    Reconnected,
    SessionClosed,
    SessionEvent,
    SessionFailed,
    StateRestored,
    log_event,
)
from holdfast.sdk.options import QueueOptions, ReconnectOptions, SessionOptions
from holdfast.sdk.types import Ack, AckStatus, Message

if TYPE_CHECKING:
    from holdfast.sdk.queue import Queue
    from holdfast.sdk.rpc import Reply, Request, StreamingReply, Worker, WorkerOptions
    from holdfast.sdk.session import Session
    from holdfast.sdk.stats import SessionStats

_LAZY = {
    "Queue": "holdfast.sdk.queue",
    "Reply": "holdfast.sdk.rpc",
    "Request": "holdfast.sdk.rpc",
    "StreamingReply": "holdfast.sdk.rpc",
    "Worker": "holdfast.sdk.rpc",
    "WorkerOptions": "holdfast.sdk.rpc",
    "Session": "holdfast.sdk.session",
    "SessionStats": "holdfast.sdk.stats",
}
"""The front-ends, imported on first use (PEP 562): the broker and the proxy import
``holdfast.sdk``'s engine, errors and tracing, and the session, the queue and
request/reply (gRPC's client, the asyncio front-end, the rpc layer) added about 50 ms,
a fifth, to their imports, which every restart, the admin command and each test's
servers pay."""


if not TYPE_CHECKING:
    # Runtime only: a module __getattr__ seen by a type checker would type every
    # unknown name (a typo in an import) as ``object`` instead of refusing it.

    def __getattr__(name: str) -> object:
        """Import a front-end (``_LAZY``) the first time it is asked for, then keep it here."""
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        """The module's names, the front-ends not yet imported included."""
        return sorted(set(globals()) | set(_LAZY))


quiet_library_logger()

__all__ = [
    "Ack",
    "AckStatus",
    "AlreadySettledError",
    "AuthenticationError",
    "BandwidthLimitError",
    "BrokerBusyError",
    "BrokerUnreachableError",
    "BufferFullError",
    "CallLostError",
    "CommitMarkConflictError",
    "ConfirmDroppedError",
    "ConfirmRejected",
    "ConnectAttemptFailed",
    "Connected",
    "ConnectionLost",
    "DataLost",
    "DeadLetteredError",
    "DeliveriesRevoked",
    "FlowControlError",
    "HoldfastError",
    "InvalidArgumentError",
    "InvalidPropertiesError",
    "InvalidQueueUriError",
    "LimitExceededError",
    "LocalProtocolError",
    "Message",
    "NotWritableError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "ProtocolError",
    "ProtocolVersionError",
    "Queue",
    "QueueInUseError",
    "QueueNotFoundError",
    "QueueNotOpenError",
    "QueueOptions",
    "QueueReopened",
    "QueueStateError",
    "ReconnectOptions",
    "Reconnected",
    "RemoteHandlerError",
    "RemoteProtocolError",
    "Reply",
    "ReplyExpiredError",
    "Request",
    "RequestFailedError",
    "RequestRefusedError",
    "RequestTimeoutError",
    "RetryableTransportError",
    "RpcCancelledError",
    "RpcError",
    "RpcTimeoutError",
    "Session",
    "SessionClosed",
    "SessionClosedError",
    "SessionEvent",
    "SessionFailed",
    "SessionOptions",
    "SessionStats",
    "StateRestored",
    "StreamError",
    "StreamTakenError",
    "StreamingReply",
    "TerminalTransportError",
    "TransportError",
    "UnknownRequestError",
    "UnsupportedCallError",
    "UpstreamUnavailableError",
    "Worker",
    "WorkerLostError",
    "WorkerOptions",
    "WorkerStartError",
    "log_event",
]
