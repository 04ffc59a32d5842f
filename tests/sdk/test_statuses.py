"""The one mapping between wire statuses and the SDK's outcomes and errors, and the
engine's use of the contract's shared checks and limits."""

from __future__ import annotations

import pytest

from holdfast.broker.redis.put_scripts import PUT_REFUSALS
from holdfast.proto import pb, status_name
from holdfast.proto.limits import Limits
from holdfast.proto.validate import ACK_STATUSES, Invalid, InvalidUri
from holdfast.sdk.errors import (
    BufferFullError,
    HoldfastError,
    InvalidArgumentError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    NotWritableError,
    PayloadTooLargeError,
    QueueNotOpenError,
    RequestFailedError,
    RequestTimeoutError,
    TerminalTransportError,
)
from holdfast.sdk.events import SessionFailed
from holdfast.sdk.statuses import (
    ack_status,
    invalid_error,
    relay_status,
    request_error,
    wire_status_of,
)
from holdfast.sdk.types import AckStatus

from .fakes import URI, Harness


def test_status_name_drops_the_prefix_and_names_unknown_numbers() -> None:
    assert status_name(pb.STATUS_OK) == "OK"
    assert status_name(pb.STATUS_HISTORY_FULL) == "HISTORY_FULL"
    assert status_name(999) == "STATUS_999"


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (pb.STATUS_OK, AckStatus.SUCCESS),
        (pb.STATUS_UNKNOWN, AckStatus.UNKNOWN),
        # Too old to be recognised: it may or may not be in the queue.
        (pb.STATUS_TOO_OLD, AckStatus.UNKNOWN),
        (pb.STATUS_CONFLICT, AckStatus.CONFLICT),
        (pb.STATUS_STORE_ERROR, AckStatus.STORE_ERROR),
        (pb.STATUS_SHUTTING_DOWN, AckStatus.REFUSED),
        (pb.STATUS_QUEUE_FULL, AckStatus.REFUSED),
        # A newer broker's status, or none: it may or may not be in the queue.
        (999, AckStatus.UNKNOWN),
        (pb.STATUS_UNSPECIFIED, AckStatus.UNKNOWN),
    ],
)
def test_ack_status_of_every_wire_status(wire: int, expected: AckStatus) -> None:
    assert ack_status(wire) is expected


def test_every_ack_status_but_refused_relays_as_a_wire_status_that_maps_back() -> None:
    for status in AckStatus:
        if status is not AckStatus.REFUSED:
            assert ack_status(wire_status_of(status)) is status
    assert ack_status(wire_status_of(AckStatus.REFUSED)) is not AckStatus.SUCCESS


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (pb.STATUS_TOO_OLD, AckStatus.UNKNOWN),
        (pb.STATUS_CONFLICT, AckStatus.CONFLICT),
    ],
)
def test_the_engine_reports_acks_through_the_mapping(wire: pb.Status, expected: AckStatus) -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guid = h.post(queue_id)
    h.ack(guid, status=wire)
    assert h.statuses(guid) == [expected]


def test_request_error_names_the_status() -> None:
    error = request_error(pb.STATUS_ALREADY_OPEN, "queue_id 1 is already open")
    assert (error.status, error.message) == ("ALREADY_OPEN", "queue_id 1 is already open")
    assert request_error(999, "").status == "STATUS_999"


@pytest.mark.parametrize(
    ("invalid", "expected"),
    [
        (InvalidUri("bad uri"), InvalidQueueUriError),
        (Invalid(pb.STATUS_PAYLOAD_TOO_LARGE, "big"), PayloadTooLargeError),
        (Invalid(pb.STATUS_INVALID_PROPERTIES, "props"), InvalidPropertiesError),
        (Invalid(pb.STATUS_INVALID_ARGUMENT, "neither"), InvalidArgumentError),
    ],
)
def test_refused_checks_become_typed_sdk_errors(
    invalid: Invalid, expected: type[InvalidArgumentError]
) -> None:
    error = invalid_error(invalid)
    assert type(error) is expected
    assert str(error) == invalid.message


@pytest.mark.parametrize(
    ("error", "default", "expected"),
    [
        (RequestFailedError("ALREADY_OPEN", "m"), pb.STATUS_UNSPECIFIED, pb.STATUS_ALREADY_OPEN),
        (RequestFailedError("STATUS_999", ""), pb.STATUS_UNSPECIFIED, pb.STATUS_UNSPECIFIED),
        (RequestTimeoutError("slow"), pb.STATUS_UNSPECIFIED, pb.STATUS_SHUTTING_DOWN),
        (PayloadTooLargeError("big"), pb.STATUS_UNKNOWN_QUEUE, pb.STATUS_PAYLOAD_TOO_LARGE),
        (InvalidPropertiesError("p"), pb.STATUS_UNKNOWN_QUEUE, pb.STATUS_INVALID_PROPERTIES),
        (NotWritableError("ro"), pb.STATUS_UNKNOWN_QUEUE, pb.STATUS_NOT_WRITABLE),
        (InvalidQueueUriError("u"), pb.STATUS_UNKNOWN_QUEUE, pb.STATUS_INVALID_ARGUMENT),
        (QueueNotOpenError("closed"), pb.STATUS_UNKNOWN_QUEUE, pb.STATUS_UNKNOWN_QUEUE),
        (BufferFullError("full"), pb.STATUS_UNKNOWN_QUEUE, pb.STATUS_UNKNOWN_QUEUE),
    ],
)
def test_relay_status_of_sdk_errors(
    error: HoldfastError, default: pb.Status, expected: pb.Status
) -> None:
    assert relay_status(error, default)[0] == expected


def test_every_status_a_broker_or_proxy_acks_with_is_one_the_sdk_accepts() -> None:
    """``validate.ACK_STATUSES`` refuses the rest as a malformed batch (the connection
    ends): a peer's own ACKs must never fall outside it."""
    relayed = {wire_status_of(status) for status in AckStatus}
    # What a proxy answers a PUT its upstream session refuses at once (proxy.relay).
    for error in (
        QueueNotOpenError("q"),
        NotWritableError("w"),
        InvalidArgumentError("a"),
        PayloadTooLargeError("p"),
        InvalidPropertiesError("i"),
        BufferFullError("b"),
    ):
        relayed.add(relay_status(error, pb.STATUS_UNKNOWN_QUEUE)[0])
    refusals = set(PUT_REFUSALS.values()) | {pb.STATUS_HISTORY_FULL, pb.STATUS_LIMIT_EXCEEDED}
    assert relayed | refusals <= ACK_STATUSES
    assert pb.STATUS_UNSPECIFIED not in ACK_STATUSES
    assert set(pb.Status.values()) >= ACK_STATUSES


# -- the engine applies the shared checks and limits -------------------------------------


def test_the_engine_counts_property_bytes_as_the_broker_does() -> None:
    # 1 + 99 bytes of key and value: within a 100-byte limit at the broker, so the SDK
    # must not refuse it (it used to count 4 more bytes per property).
    h = Harness()
    h.connect()
    h.answer_hello(max_properties_bytes=100)
    queue_id = h.open_active()
    h.post(queue_id, properties={"k": "x" * 99})
    assert h.engine.pending_count == 1
    with pytest.raises(InvalidPropertiesError, match="101 bytes"):
        h.post(queue_id, properties={"k": "x" * 100})


def test_the_engine_refuses_a_uri_with_a_trailing_newline() -> None:
    h = Harness()
    h.establish()
    with pytest.raises(InvalidQueueUriError):
        h.open_queue(URI + "\n")
    assert h.sent_frames() == []


def test_the_engine_takes_the_announced_limits() -> None:
    h = Harness()
    h.connect()
    h.answer_hello(window=6, max_payload_bytes=10, max_properties=2, broker_id="b7")
    assert h.engine.limits == Limits(6.0, 10, 2, Limits().max_properties_bytes)
    assert h.engine.broker_id == "b7"


def test_a_broker_announcing_unusable_limits_fails_the_session() -> None:
    h = Harness()
    h.connect()
    h.answer_hello(window=0)
    assert isinstance(h.engine.failure, TerminalTransportError)
    assert "unusable limits" in str(h.engine.failure)
    assert len(h.events_of(SessionFailed)) == 1


def test_every_error_class_is_exported_and_named_in_the_readme() -> None:
    import inspect
    from pathlib import Path

    import holdfast.sdk as sdk
    from holdfast.sdk import errors

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    classes = [
        name
        for name, value in inspect.getmembers(errors, inspect.isclass)
        if issubclass(value, BaseException) and value.__module__ == errors.__name__
    ]
    assert classes
    for name in classes:
        assert name in sdk.__all__, f"{name} is not exported by holdfast.sdk"
        assert f"`{name}`" in readme, f"{name} is not in the README's error list"
