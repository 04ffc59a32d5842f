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
    │   └── BufferFullError                  optional bound on bytes buffered while disconnected
    ├── ConfirmDroppedError                  CONFIRM not sent (link down or stale delivery);
    │                                        the broker will redeliver the message
    ├── RequestFailedError                   the broker refused an open/configure/close
    ├── RequestTimeoutError (TimeoutError)   an open/configure did not complete in time
    ├── SessionClosedError                   the session was closed by the application
    ├── RemoteProtocolError                  the server sent a frame that cannot be accepted
    └── TransportError                       what the gRPC link reported
        ├── RetryableTransportError          link trouble: the session reconnects by itself
        └── TerminalTransportError           reconnecting cannot help: the session fails
            └── ProtocolVersionError         the broker speaks another protocol version

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


class ConfirmDroppedError(HoldfastError):
    """A CONFIRM was not sent because the link was down or the delivery is stale.

    The broker redelivers the message (at-least-once), so the application will see
    it again with a higher ``delivery_count``.
    """


class RequestFailedError(HoldfastError):
    """The broker refused an open, configure or close request.

    ``status`` is the broker's status name (for example ``"INVALID_ARGUMENT"``).
    """

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}" if message else status)
        self.status = status
        self.message = message


class RequestTimeoutError(HoldfastError, TimeoutError):
    """An open or configure did not complete within its timeout."""


class SessionClosedError(HoldfastError):
    """The session was closed by the application (or failed terminally)."""


class TransportError(HoldfastError):
    """A failure reported by the gRPC link."""


class RetryableTransportError(TransportError):
    """A link failure that reconnecting can cure (unavailable, reset, timed out)."""


class TerminalTransportError(TransportError):
    """A link failure that reconnecting cannot cure; the session stops retrying."""


class ProtocolVersionError(TerminalTransportError):
    """The broker does not speak this SDK's protocol version."""


class RemoteProtocolError(HoldfastError):
    """The server sent a frame this side cannot decode or accept.

    The connection that carried it is dropped and the session reconnects; when
    it keeps happening the session fails with a ``SessionFailed`` event.
    """
