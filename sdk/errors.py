"""Every error the Holdfast SDK raises, in one hierarchy.

::

    HoldfastError
    ├── InvalidArgumentError (ValueError)    bad input, refused before anything is sent
    │   ├── InvalidQueueUriError
    │   ├── PayloadTooLargeError
    │   └── InvalidPropertiesError
    ├── QueueStateError                      the queue handle cannot do that now
    │   ├── QueueNotOpenError
    │   └── NotWritableError
    ├── FlowControlError                     the message was not taken; retry later
    │   ├── BandwidthLimitError              outbound buffer over its high watermark for 5 s
    │   ├── BufferFullError                  optional bound on bytes buffered while disconnected
    │   └── BrokerBusyError                  the broker pushed back on the queue's PUTs for 5 s
    ├── ConfirmDroppedError                  CONFIRM not sent (link down or stale delivery);
    │   │                                    the broker will redeliver the message
    │   └── AlreadySettledError              ... because this delivery was settled already
    ├── RequestFailedError                   the broker refused an open/configure/close
    │   ├── CommitMarkConflictError          a version committed again with other content
    │   ├── QueueNotFoundError               an admin call named a queue the broker does not know
    │   ├── QueueInUseError                  delete refused: the queue has open handles
    │   ├── PermissionDeniedError            the token may not do this (this request only)
    │   └── LimitExceededError               a per-session or per-token limit (this request)
    ├── RequestTimeoutError (TimeoutError)   an open/configure did not complete in time
    │   └── BrokerUnreachableError           ... and cannot: the proxy reaches no broker
    ├── SessionClosedError                   the session was closed by the application
    ├── RpcError                             a request/reply call failed (holdfast.sdk.rpc)
    │   ├── RpcTimeoutError (TimeoutError)   no reply within the call's timeout
    │   │   └── WorkerLostError              ... and the worker that had it stopped heartbeating
    │   ├── RpcCancelledError                the call was cancelled (its session closed)
    │   ├── StreamError                      a data stream of a call could not complete
    │   │   └── StreamTakenError             ... it was read through an earlier fetch_reply
    │   ├── DeadLetteredError                the request was dead-lettered; ``reason`` says why
    │   ├── RemoteHandlerError               the worker's handler raised; ``error_type``
    │   ├── RequestRefusedError              the broker refused the request PUT; ``status``
    │   ├── ReplyExpiredError                a durable request's reply is past its keep time
    │   ├── CallLostError                    the broker's store lost data during the call
    │   ├── UnknownRequestError (ValueError) not a request id of this token (fetch_reply)
    │   └── WorkerStartError                 the pool's worker for the key could not start
    ├── ProtocolError                        an input that the protocol does not allow
    │   ├── LocalProtocolError               from this side: a bug in the shell around the engine
    │   └── RemoteProtocolError              from the server: the connection is dropped
    └── TransportError                       what the gRPC link reported
        ├── RetryableTransportError          link trouble: the session reconnects by itself
        │   └── UpstreamUnavailableError     the proxy refused: it reaches no broker
        └── TerminalTransportError           reconnecting cannot help: the session fails
            ├── UnsupportedCallError         the server has no such call (UNIMPLEMENTED)
            ├── ProtocolVersionError         the broker speaks another protocol version
            └── AuthenticationError          no token, or one the server does not know

gRPC status codes are sorted into retryable and terminal in one place,
``holdfast.sdk.transport.classify_rpc_error``; nothing else looks at them. Wire
statuses are mapped to these errors and to ``AckStatus`` in one place too,
``holdfast.sdk.statuses``.
Applications never see ``RetryableTransportError`` from an API call: the session
absorbs it and reports it as a ``ConnectionLost`` event.
"""

from __future__ import annotations


class HoldfastError(Exception):
    """Base of every error raised by the Holdfast SDK."""


class InvalidArgumentError(HoldfastError, ValueError):
    """An argument was refused before anything was sent; nothing was buffered."""


class InvalidQueueUriError(InvalidArgumentError):
    """A queue URI that is not ``hf://<domain>/<queue>``."""


class PayloadTooLargeError(InvalidArgumentError):
    """A payload over the broker's announced ``max_payload_bytes``."""


class InvalidPropertiesError(InvalidArgumentError):
    """Properties that are not ``str -> str`` or exceed the broker's announced limits."""


class QueueStateError(HoldfastError):
    """The queue handle is not in a state that allows the operation."""


class QueueNotOpenError(QueueStateError):
    """The queue is closed, closing, or its open has not completed."""


class NotWritableError(QueueStateError):
    """``post()`` on a queue opened without ``write=True``."""


class FlowControlError(HoldfastError):
    """The message was not taken because of flow control; it is safe to retry later."""


class BandwidthLimitError(FlowControlError):
    """The outbound buffer stayed over its high watermark for the 5-second wait.

    Raised in the thread that called ``post()``, so back-pressure reaches the
    application. The message was not taken.
    """


class BufferFullError(FlowControlError):
    """``SessionOptions.max_disconnected_buffer_bytes`` would be exceeded while disconnected."""


class BrokerBusyError(FlowControlError):
    """The broker pushed back on this queue's PUTs (the queue was at the depth limit of
    its policy, or the broker's GUID history at its memory bound) and kept doing so
    for the 5-second wait. The message was not taken; the PUTs
    already posted stay buffered and are retransmitted until the broker takes them."""


class ConfirmDroppedError(HoldfastError):
    """A CONFIRM was not sent because the link was down or the delivery is stale.

    The broker redelivers the message (at-least-once), so the application will see
    it again with a higher ``delivery_count``.
    """


class AlreadySettledError(ConfirmDroppedError):
    """``confirm()`` or ``reject()`` of a delivery that was confirmed or rejected
    already: nothing is sent (the first settle stands). A second settle sent anyway
    would be refused by the broker, and a consumer doing it at scale would be ended
    for confirming what it does not hold."""


class RequestFailedError(HoldfastError):
    """The broker refused an open, configure or close request.

    ``status`` is the broker's status name (for example ``"INVALID_ARGUMENT"``).
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}" if message else status)
        self.status = status
        self.message = message


class CommitMarkConflictError(RequestFailedError):
    """A commit mark was recorded again for the same version with another digest: the
    same batch was written twice with different content (``Session.commit_mark``)."""


class QueueNotFoundError(RequestFailedError):
    """An admin call (``holdfast.sdk.admin``) named a queue the broker does not hold."""


class QueueInUseError(RequestFailedError):
    """A queue delete was refused: sessions still have the queue open (or PUTs to it
    are in flight). Nothing was deleted; close the handles and try again."""


class PermissionDeniedError(RequestFailedError):
    """The server's ``--auth-file`` does not let this session's token do that (read or
    write a domain, or use the admin service). Only this request was refused."""


class LimitExceededError(RequestFailedError):
    """A per-session or per-token limit of the server refused this request (open
    queues, new queues per minute). The session goes on."""


class RequestTimeoutError(HoldfastError, TimeoutError):
    """An open or configure did not complete within its timeout."""


class BrokerUnreachableError(RequestTimeoutError):
    """A queue's first open failed at once: the session reaches a proxy, and the proxy
    reaches no broker; the message names the proxy's upstream and why. Queues already
    open are not failed: they reopen when a broker is back."""


class SessionClosedError(HoldfastError):
    """The session was closed by the application, or failed terminally: then the
    message says why and ``__cause__`` is the failure. Every call on the session and
    on its queues raises it from then on (``Queue.close()`` excepted: a no-op)."""

    @classmethod
    def of(cls, failure: HoldfastError | None) -> SessionClosedError:
        """What a call on an ended session raises: closed (``failure`` None) or failed."""
        if failure is None:
            return cls("the session is closed")
        error = cls(f"the session failed: {failure}")
        error.__cause__ = failure
        return error


class ProtocolError(HoldfastError):
    """An input the protocol does not allow (see ``holdfast.sdk.state``)."""


class LocalProtocolError(ProtocolError):
    """The engine was given an input its state tables refuse: a bug in the code
    around it (a shell, a test), never something a server or a user can cause."""


class RemoteProtocolError(ProtocolError):
    """The server sent a frame this SDK cannot accept (bytes that do not parse, a GUID
    that is not 16 bytes, a frame out of order). The connection is dropped and the
    session reconnects; a server that keeps doing it fails the session."""


class TransportError(HoldfastError):
    """A failure reported by the gRPC link."""


class RetryableTransportError(TransportError):
    """A link failure that reconnecting can cure (unavailable, reset, timed out)."""


class UpstreamUnavailableError(RetryableTransportError):
    """The proxy ended the connection because it cannot reach any broker (its message
    says which and why); the session keeps reconnecting."""


class TerminalTransportError(TransportError):
    """A link failure that reconnecting cannot cure; the session stops retrying."""


class UnsupportedCallError(TerminalTransportError):
    """The server has no such call (gRPC ``UNIMPLEMENTED``): an older broker or proxy."""


class ProtocolVersionError(TerminalTransportError):
    """The broker does not speak this SDK's protocol version."""


class AuthenticationError(TerminalTransportError):
    """The server requires a token (``--auth-file``) and this session sent none or one
    it does not know: the session fails (reconnecting cannot help). Set
    ``SessionOptions(token=...)`` or ``$HOLDFAST_TOKEN``."""


class RpcError(HoldfastError):
    """A request/reply call (``Session.request``) did not produce a reply."""


class RpcTimeoutError(RpcError, TimeoutError):
    """No reply arrived within the call's ``timeout``; the worker (if any) was told to cancel."""


class WorkerLostError(RpcTimeoutError):
    """No reply within the timeout, and the worker that collected the request stopped
    heartbeating (it died or lost its connection) and no other worker answered in time."""


class RpcCancelledError(RpcError):
    """The call was cancelled before its reply arrived (for example, its session closed)."""


class StreamError(RpcError):
    """A data stream of a request (``session.request(..., streams=...)``) could not
    complete: its sender failed or went away, or no chunk came within the stall timeout.
    Raised by the caller's call and by the worker's ``request.streams[name].read``."""


class StreamTakenError(StreamError):
    """``reply.streams[name].read`` of a reply fetched again with ``fetch_reply``: the
    reply's data streams went to the first fetch that returned it (a stream is sent
    once, not kept), so this one has none to read. Raised at once, not after the stall
    timeout; the reply's payload and properties are fetched as often as wanted."""


class DeadLetteredError(RpcError):
    """The request was dead-lettered instead of processed.

    ``reason`` is a dead-letter reason (``x-death-reason``): ``"expired"`` when no
    worker picked the request up within its pickup timeout.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"dead-lettered ({reason}): {message}")
        self.reason = reason
        self.message = message


class RemoteHandlerError(RpcError):
    """The worker's handler raised; ``error_type`` is its exception's class name."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(f"{error_type}: {message}" if message else error_type)
        self.error_type = error_type
        self.message = message


class WorkerStartError(RpcError):
    """The keyed worker pool could not start a worker for the call's key.

    ``pool`` and ``key`` name the group; the message carries the worker's exit status
    and the end of its stderr, as the pool manager saw them.
    """

    def __init__(self, pool: str, key: str, message: str) -> None:
        super().__init__(message)
        self.pool = pool
        self.key = key
        self.message = message


class RequestRefusedError(RpcError):
    """The broker refused the request PUT; ``status`` is the ``AckStatus`` name."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class ReplyExpiredError(RpcError):
    """``fetch_reply``: the durable request's reply is past its keep time (the broker
    dropped it, or never got it in time); it can no longer be fetched."""


class CallLostError(RpcError):
    """The broker's store lost acknowledged data while the call was waiting (a
    ``DataLost`` event): its request or its reply may be gone, so no reply may ever
    come. The worker may or may not have run it; call again if that is safe."""


class UnknownRequestError(RpcError, ValueError):
    """``fetch_reply``: the id is not one ``request_durable`` issued to a session of
    this token (malformed, altered, or issued under another token)."""
