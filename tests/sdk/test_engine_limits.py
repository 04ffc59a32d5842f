"""Rule 7 (high watermark), the bounded buffer, bad input, protocol version and
session close, scripted against ``SessionEngine``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.sdk.engine import HIGH_WATERMARK_WAIT, PUT_OVERHEAD, LinkState
from holdfast.sdk.errors import (
    BufferFullError,
    InvalidPropertiesError,
    InvalidQueueUriError,
    NotWritableError,
    PayloadTooLargeError,
    ProtocolVersionError,
    QueueNotOpenError,
    RequestFailedError,
    SessionClosedError,
)
from holdfast.sdk.events import (
    QueueReopened,
    SessionClosed,
    SessionFailed,
)
from holdfast.sdk.frames import MAX_PUTS_PER_FRAME, encode
from holdfast.sdk.outbound import OutboundItem
from holdfast.sdk.types import AckStatus
from tests.support.columns import puts_of

from .fakes import Harness, put_guids, puts_in, reader, reconnect, writer

OTHER = "hf://test/invoices"
THIRD = "hf://test/refunds"


@pytest.fixture
def h() -> Harness:
    return Harness()


# ========================================================================= rule 7: high watermark


def test_high_watermark_wait_is_five_seconds() -> None:
    assert HIGH_WATERMARK_WAIT == 5.0


def test_over_high_watermark_once_queued_bytes_reach_it() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.engine.transport_drained(10_000)  # the handshake frames are written
    assert not h.engine.over_high_watermark()
    h.post(queue_id, b"x" * (600 - PUT_OVERHEAD))
    h.post(queue_id, b"x" * (399 - PUT_OVERHEAD))
    assert not h.engine.over_high_watermark()  # 999 bytes queued
    h.post(queue_id, b"x")  # 1040 bytes queued
    assert h.engine.over_high_watermark()


def test_high_watermark_is_reached_at_exactly_its_size() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.engine.transport_drained(10_000)
    h.post(queue_id, b"x" * (1000 - PUT_OVERHEAD))
    assert h.engine.over_high_watermark()


def test_bytes_taken_by_the_transport_count_until_drained() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.post(queue_id, b"x" * 2000)
    items = h.engine.take_outbound()
    assert h.engine.over_high_watermark()  # taken, not yet written
    # The shells drain by the bytes encode() accounts to each frame, as they are written.
    h.engine.transport_drained(sum(nbytes for _, nbytes in encode(items, 1024 * 1024, h.now)))
    assert not h.engine.over_high_watermark()


def test_never_over_high_watermark_while_disconnected() -> None:
    h = Harness(high_watermark_bytes=1000)
    queue_id = writer(h)
    h.post(queue_id, b"x" * 2000)
    h.sent_frames()
    assert h.engine.over_high_watermark()
    h.lose()
    assert not h.engine.over_high_watermark()
    for _ in range(10):
        h.post(queue_id, b"x" * 2000)
        assert not h.engine.over_high_watermark()


# ================================================================================= bounded buffer


def test_disconnected_buffer_limit_refuses_the_put_and_keeps_nothing() -> None:
    h = Harness(max_disconnected_buffer_bytes=1000)
    queue_id = writer(h)
    h.lose()
    h.post(queue_id, b"x" * (600 - PUT_OVERHEAD))
    with pytest.raises(BufferFullError):
        h.post(queue_id, b"x" * (600 - PUT_OVERHEAD))
    assert h.engine.pending_count == 1
    assert h.acks == []
    assert len(put_guids(reconnect(h))) == 1


def test_disconnected_buffer_limit_does_not_bound_an_active_link() -> None:
    h = Harness(max_disconnected_buffer_bytes=1000)
    queue_id = writer(h)
    for _ in range(3):
        h.post(queue_id, b"x" * 600)
    assert h.engine.pending_count == 3


# ====================================================================================== bad input


@pytest.mark.parametrize(
    "uri",
    ["", "orders", "http://test/orders", "hf://test", "hf://test/", "hf:///orders", "hf://a/b/c"],
)
def test_open_with_an_invalid_uri_raises_invalid_queue_uri(h: Harness, uri: str) -> None:
    h.establish()
    with pytest.raises(InvalidQueueUriError):
        h.open_queue(uri)
    assert h.sent_frames() == []


def test_payload_limit_is_the_one_the_broker_announced(h: Harness) -> None:
    h.connect()
    h.answer_hello(max_payload_bytes=100)
    queue_id = h.open_active()
    with pytest.raises(PayloadTooLargeError):
        h.post(queue_id, b"x" * 101)
    assert h.engine.pending_count == 0
    h.post(queue_id, b"x" * 100)
    assert h.engine.pending_count == 1


@pytest.mark.parametrize(
    "properties",
    [
        {"count": 3},
        {"key": b"bytes"},
        {1: "int key"},
        {"a": "1", "b": "2", "c": "3"},  # over the announced max_properties=2
        {"big": "x" * 200},  # over the announced max_properties_bytes=100
    ],
)
def test_bad_properties_raise_invalid_properties(
    h: Harness, properties: dict[object, object]
) -> None:
    h.connect()
    h.answer_hello(max_properties=2, max_properties_bytes=100)
    queue_id = h.open_active()
    with pytest.raises(InvalidPropertiesError):
        h.post(queue_id, properties=properties)  # type: ignore[arg-type]
    assert h.engine.pending_count == 0
    assert h.sent_frames() == []


def test_properties_travel_with_the_put(h: Harness) -> None:
    queue_id = writer(h)
    h.post(queue_id, properties={"kind": "order", "region": "eu"})
    (put,) = puts_in(h.sent_frames())
    assert dict(put.properties) == {"kind": "order", "region": "eu"}


def test_post_to_a_read_only_queue_raises_not_writable(h: Harness) -> None:
    queue_id = reader(h)
    with pytest.raises(NotWritableError):
        h.post(queue_id)
    assert h.engine.pending_count == 0


def test_post_to_an_unknown_queue_raises_queue_not_open(h: Harness) -> None:
    h.establish()
    with pytest.raises(QueueNotOpenError):
        h.post(42)
    assert h.engine.pending_count == 0


def test_post_before_the_first_open_completes_raises_queue_not_open(h: Harness) -> None:
    h.establish()
    queue_id, _ = h.open_queue()
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)
    assert h.engine.pending_count == 0


def test_refused_first_open_completes_with_the_error(h: Harness) -> None:
    h.establish()
    queue_id, request_id = h.open_queue()
    h.answer_opens(h.sent_frames(), status=pb.STATUS_INVALID_ARGUMENT)
    (error,) = h.outcomes(request_id)
    assert isinstance(error, RequestFailedError)
    assert h.events_of(QueueReopened) == []
    with pytest.raises(QueueNotOpenError):
        h.post(queue_id)


# =============================================================================== protocol version


def test_hello_announces_protocol_version_and_client_id(h: Harness) -> None:
    h.connect()
    (hello,) = [f.hello for f in h.sent_frames()]
    assert hello.protocol_version == PROTOCOL_VERSION
    assert hello.client_id == "client-1"


def fail_with_other_version(h: Harness) -> None:
    h.answer_hello(protocol_version=PROTOCOL_VERSION + 1)


def fail_with_error_frame(h: Harness) -> None:
    h.feed(
        pb.ServerFrame(
            error=pb.Error(status=pb.STATUS_VERSION_MISMATCH, message="speak v2", fatal=True)
        )
    )


@pytest.mark.parametrize("mismatch", [fail_with_other_version, fail_with_error_frame])
def test_with_retry_refusals_a_mismatch_ends_the_connection_only(
    mismatch: Callable[[Harness], None],
) -> None:
    """A proxy's engine: the refusal is raised for the shell to end the connection
    with; the session lives on, its PUTs kept for the next broker."""
    h = Harness(retry_refusals=True)
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.lose()
    h.connect()

    with pytest.raises(ProtocolVersionError):
        mismatch(h)

    assert h.engine.failure is None
    assert h.statuses(guid) == []  # still pending
    h.lose()
    h.connect()
    assert h.state() is not LinkState.FAILED


@pytest.mark.parametrize("mismatch", [fail_with_other_version, fail_with_error_frame])
def test_version_mismatch_fails_the_session(mismatch: Callable[[Harness], None]) -> None:
    h = Harness()
    queue_id = writer(h)
    guid = h.post(queue_id)
    h.lose()
    h.connect()

    mismatch(h)

    assert h.state() is LinkState.FAILED
    assert isinstance(h.engine.failure, ProtocolVersionError)
    assert h.statuses(guid) == [AckStatus.UNKNOWN]
    assert isinstance(h.events[-1], SessionFailed)
    assert h.engine.pending_count == 0
    with pytest.raises(SessionClosedError):
        h.post(queue_id)
    with pytest.raises(SessionClosedError):
        h.engine.connection_made("broker-a:7700")


# ================================================================================== session close


def test_close_reports_pending_puts_unknown_and_emits_session_closed(h: Harness) -> None:
    queue_id = writer(h)
    acked, first, second = h.post(queue_id), h.post(queue_id), h.post(queue_id)
    h.ack(acked)
    h.engine.close()
    h.run_callbacks()
    assert h.statuses(first) == h.statuses(second) == [AckStatus.UNKNOWN]
    assert h.statuses(acked) == [AckStatus.SUCCESS]
    assert h.events[-1] == SessionClosed(unknown=2)
    assert h.state() is LinkState.CLOSED


def test_calls_after_close_raise_session_closed(h: Harness) -> None:
    queue_id = writer(h)
    h.engine.close()
    with pytest.raises(SessionClosedError):
        h.post(queue_id)
    with pytest.raises(SessionClosedError):
        h.open_queue(OTHER)
    with pytest.raises(SessionClosedError):
        h.engine.close_queue(queue_id)


def test_close_fails_requests_still_waiting(h: Harness) -> None:
    h.establish()
    _, request_id = h.open_queue()
    h.engine.close()
    h.run_callbacks()
    (error,) = h.outcomes(request_id)
    assert isinstance(error, SessionClosedError)


def test_a_backlog_is_sent_in_put_frames_of_at_most_max_puts_per_frame() -> None:
    # After a reconnect the broker can ACK the head of a retransmitted backlog while the
    # rest is still on its way.
    backlog: list[OutboundItem] = [
        (bytes([i % 256, i // 256]) * 8, 1, b"x" * 100, {}, None, 0.0, 100 + PUT_OVERHEAD)
        for i in range(2500)
    ]
    frames = list(encode(backlog, 1024 * 1024, 1.0))
    assert [len(puts_of(frame.puts)) for frame, _ in frames] == [
        MAX_PUTS_PER_FRAME,
        MAX_PUTS_PER_FRAME,
        2500 - 2 * MAX_PUTS_PER_FRAME,
    ]
