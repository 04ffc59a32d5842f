"""Wire statuses and the SDK's outcomes and errors: the one place that maps them.

- an ACK's wire status -> ``AckStatus`` (``ack_status``), and back for the outcomes
  the SDK decides itself (``wire_status_of``);
- a refused open/configure/close -> ``RequestFailedError`` (``request_error``), a
  refused commit mark call -> its typed error (``commit_mark_error``), a refused
  admin call -> its typed error (``admin_error``);
- a refused contract check (``holdfast.proto.validate.Invalid``) -> the SDK's typed
  ``InvalidArgumentError`` (``invalid_error``);
- an SDK error -> the wire status a proxy relays it with (``relay_status``).
"""

from __future__ import annotations

from typing import cast

from holdfast.proto import pb, status_name
from holdfast.proto.validate import Invalid, InvalidUri
from holdfast.sdk.errors import (
    AuthenticationError,
    CommitMarkConflictError,
    HoldfastError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    LimitExceededError,
    NotWritableError,
    PayloadTooLargeError,
    PermissionDeniedError,
    ProtocolVersionError,
    QueueInUseError,
    QueueNotFoundError,
    RequestFailedError,
    RequestTimeoutError,
)
from holdfast.sdk.types import AckStatus

_ACK_STATUS: dict[int, AckStatus] = {
    pb.STATUS_OK: AckStatus.SUCCESS,
    pb.STATUS_UNKNOWN: AckStatus.UNKNOWN,
    # Too old for the broker to recognise a replay: an earlier copy may or may not be
    # in the queue, which is exactly what UNKNOWN says.
    pb.STATUS_TOO_OLD: AckStatus.UNKNOWN,
    pb.STATUS_CONFLICT: AckStatus.CONFLICT,
    pb.STATUS_INVALID_GUID: AckStatus.INVALID_GUID,
    pb.STATUS_PAYLOAD_TOO_LARGE: AckStatus.PAYLOAD_TOO_LARGE,
    pb.STATUS_INVALID_PROPERTIES: AckStatus.INVALID_PROPERTIES,
    pb.STATUS_NOT_WRITABLE: AckStatus.NOT_WRITABLE,
    pb.STATUS_UNKNOWN_QUEUE: AckStatus.UNKNOWN_QUEUE,
    pb.STATUS_STORE_ERROR: AckStatus.STORE_ERROR,
    pb.STATUS_PERMISSION_DENIED: AckStatus.PERMISSION_DENIED,
}

_WIRE_STATUS: dict[AckStatus, pb.Status] = {
    AckStatus.SUCCESS: pb.STATUS_OK,
    AckStatus.UNKNOWN: pb.STATUS_UNKNOWN,
    AckStatus.CONFLICT: pb.STATUS_CONFLICT,
    AckStatus.INVALID_GUID: pb.STATUS_INVALID_GUID,
    AckStatus.PAYLOAD_TOO_LARGE: pb.STATUS_PAYLOAD_TOO_LARGE,
    AckStatus.INVALID_PROPERTIES: pb.STATUS_INVALID_PROPERTIES,
    AckStatus.NOT_WRITABLE: pb.STATUS_NOT_WRITABLE,
    AckStatus.UNKNOWN_QUEUE: pb.STATUS_UNKNOWN_QUEUE,
    AckStatus.STORE_ERROR: pb.STATUS_STORE_ERROR,
    AckStatus.PERMISSION_DENIED: pb.STATUS_PERMISSION_DENIED,
}

_INVALID_ERRORS: dict[int, type[InvalidArgumentError]] = {
    pb.STATUS_PAYLOAD_TOO_LARGE: PayloadTooLargeError,
    pb.STATUS_INVALID_PROPERTIES: InvalidPropertiesError,
}

_REQUEST_ERRORS: dict[int, type[RequestFailedError]] = {
    pb.STATUS_PERMISSION_DENIED: PermissionDeniedError,
    pb.STATUS_LIMIT_EXCEEDED: LimitExceededError,
}

_RELAYED: tuple[tuple[type[HoldfastError], pb.Status], ...] = (
    (PayloadTooLargeError, pb.STATUS_PAYLOAD_TOO_LARGE),
    (InvalidPropertiesError, pb.STATUS_INVALID_PROPERTIES),
    (NotWritableError, pb.STATUS_NOT_WRITABLE),
    (InvalidArgumentError, pb.STATUS_INVALID_ARGUMENT),
)


def ack_status(status: int) -> AckStatus:
    """What an ACK's wire status means to the application. A status with no outcome of
    its own (``SHUTTING_DOWN``, ``QUEUE_FULL``) is ``REFUSED``: not in the queue. An
    ACK from the wire never carries a status outside ``validate.ACK_STATUSES`` (its
    batch is malformed: the connection ends, the PUTs stay buffered); should one get
    here, it is ``UNKNOWN``: it may or may not be in the queue, the one answer that
    cannot be wrong (REFUSED could lead an application to post again a message that
    is in the queue)."""
    known = _ACK_STATUS.get(status)
    if known is not None:
        return known
    if status == pb.STATUS_UNSPECIFIED or status not in _KNOWN_STATUSES:
        return AckStatus.UNKNOWN
    return AckStatus.REFUSED


_KNOWN_STATUSES = frozenset(pb.Status.values())


def wire_status_of(status: AckStatus) -> pb.Status:
    """The wire status that relays ``status`` (a proxy ACKs its clients with it).
    ``REFUSED`` has no single wire status: it is relayed as ``STATUS_UNKNOWN_QUEUE``,
    also a refusal that leaves nothing in the queue."""
    return _WIRE_STATUS.get(status, pb.STATUS_UNKNOWN_QUEUE)


def request_error(status: int, message: str) -> RequestFailedError:
    """The error a refused open, configure or close request fails with."""
    kind = _REQUEST_ERRORS.get(status, RequestFailedError)
    return kind(status_name(status), message)


def session_error(status: int, message: str) -> HoldfastError | None:
    """The error a session fails with for a server Error frame of ``status`` (None:
    not a session-ending status): another protocol version, or a refused token."""
    if status == pb.STATUS_VERSION_MISMATCH:
        return ProtocolVersionError(message or "protocol version mismatch")
    if status == pb.STATUS_UNAUTHENTICATED:
        return AuthenticationError(
            f"the server refused this session's token: {message[:200]} "
            "(set SessionOptions(token=...) or $HOLDFAST_TOKEN; a proxy's own token: "
            "--upstream-token-file or $HOLDFAST_UPSTREAM_TOKEN)"
        )
    return None


def commit_mark_error(status: int, message: str) -> HoldfastError | None:
    """The error a refused ``CommitMark`` call raises (None for ``STATUS_OK``)."""
    if status == pb.STATUS_OK:
        return None
    if status == pb.STATUS_CONFLICT:
        return CommitMarkConflictError(status_name(status), message)
    if status == pb.STATUS_INVALID_ARGUMENT:
        return InvalidArgumentError(message)
    if status == pb.STATUS_UNAUTHENTICATED:
        return AuthenticationError(message)
    return request_error(status, message)


def admin_error(status: int, message: str) -> HoldfastError | None:
    """The error a refused admin call raises (None for ``STATUS_OK``)."""
    if status == pb.STATUS_OK:
        return None
    if status == pb.STATUS_INVALID_ARGUMENT:
        return InvalidArgumentError(message)
    if status == pb.STATUS_NOT_FOUND:
        return QueueNotFoundError(status_name(status), message)
    if status == pb.STATUS_QUEUE_IN_USE:
        return QueueInUseError(status_name(status), message)
    if status == pb.STATUS_UNAUTHENTICATED:
        return AuthenticationError(message)
    return request_error(status, message)


def invalid_error(error: Invalid) -> InvalidArgumentError:
    """The SDK's typed error for input the contract's checks refused."""
    if isinstance(error, InvalidUri):
        return InvalidQueueUriError(error.message)
    return _INVALID_ERRORS.get(error.status, InvalidArgumentError)(error.message)


def relay_status(
    error: HoldfastError, default: pb.Status = pb.STATUS_INVALID_ARGUMENT
) -> tuple[pb.Status, str]:
    """The wire status and message that relay ``error`` (raised by the proxy's upstream
    session) to a client; ``default`` for an error with no status of its own."""
    if isinstance(error, RequestFailedError):
        try:
            return cast(pb.Status, pb.Status.Value(f"STATUS_{error.status}")), error.message
        except ValueError:
            return default, str(error)
    if isinstance(error, RequestTimeoutError):
        return pb.STATUS_SHUTTING_DOWN, f"the broker did not answer in time: {error}"
    for kind, status in _RELAYED:
        if isinstance(error, kind):
            return status, str(error)
    return default, str(error)
