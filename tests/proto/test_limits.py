"""The limits' one definition, the HelloReply built from them and parsed back."""

from __future__ import annotations

import pytest

from holdfast.broker import BrokerConfig
from holdfast.broker.queues import FlowLimits
from holdfast.proto import PROTOCOL_VERSION, pb
from holdfast.proto.limits import (
    DEFAULT_LIMITS,
    FRAME_CEILING,
    MAX_BATCH_BYTES,
    MIB,
    Limits,
    hello_reply,
    limits_from_hello,
)
from holdfast.proxy import ProxyConfig
from holdfast.sdk.options import QueueOptions, SessionOptions


def test_defaults() -> None:
    assert Limits(300.0, 4 * MIB, 64, 64 * 1024) == DEFAULT_LIMITS


def test_hello_reply_carries_the_limits_and_parses_back() -> None:
    limits = Limits(dedup_window=6.5, max_payload_bytes=1000, max_properties=3)
    frame = hello_reply("s1", limits, "b1")
    reply = frame.hello_reply
    assert (reply.protocol_version, reply.session_id, reply.broker_id) == (
        PROTOCOL_VERSION,
        "s1",
        "b1",
    )
    assert reply.dedup_window_ms == 6500
    assert limits_from_hello(reply) == limits


def test_sizes_left_at_zero_in_a_hello_reply_mean_the_defaults() -> None:
    parsed = limits_from_hello(pb.HelloReply(dedup_window_ms=1000))
    assert parsed == Limits(dedup_window=1.0)


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (pb.HelloReply(), "dedup_window"),
        (pb.HelloReply(dedup_window_ms=1000, max_payload_bytes=FRAME_CEILING), "frames"),
    ],
)
def test_a_hello_reply_with_unusable_limits_is_refused(reply: pb.HelloReply, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        limits_from_hello(reply)


def test_every_valid_frame_fits_the_frame_limit_and_it_fits_the_ceiling() -> None:
    limits = Limits(max_payload_bytes=1000, max_properties=2, max_properties_bytes=10)
    assert limits.max_put_bytes >= 1000 + 10
    assert limits.max_frame_bytes == MAX_BATCH_BYTES + limits.max_put_bytes
    assert DEFAULT_LIMITS.max_frame_bytes <= FRAME_CEILING
    with pytest.raises(ValueError, match=r"over the \d+ bytes every client accepts"):
        Limits(max_payload_bytes=FRAME_CEILING - MAX_BATCH_BYTES)


@pytest.mark.parametrize(
    "bad",
    [
        {"dedup_window": 0},
        {"max_payload_bytes": 0},
        {"max_properties": -1},
        {"max_properties_bytes": -1},
    ],
)
def test_limits_check_their_values(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        Limits(**bad)  # type: ignore[arg-type]


def test_the_broker_announces_and_enforces_its_configured_limits() -> None:
    config = BrokerConfig(
        listen="127.0.0.1:0", dedup_window=6, max_payload_bytes=1000, max_properties=2
    )
    assert config.limits == Limits(6.0, 1000, 2, DEFAULT_LIMITS.max_properties_bytes)
    with pytest.raises(ValueError, match="every client accepts"):
        BrokerConfig(max_payload_bytes=FRAME_CEILING)


def test_batch_targets_stay_within_what_a_frame_allows_for() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        BrokerConfig(max_frame_bytes=MAX_BATCH_BYTES + 1)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        ProxyConfig(max_frame_bytes=MAX_BATCH_BYTES + 1)
    with pytest.raises(ValueError, match="max_batch_bytes"):
        SessionOptions(max_batch_bytes=MAX_BATCH_BYTES + 1)


def test_a_consumer_without_options_gets_the_sdks_default_flow_limits() -> None:
    defaults = QueueOptions()
    assert FlowLimits.from_wire(None) == FlowLimits(
        defaults.max_unconfirmed_messages, defaults.max_unconfirmed_bytes
    )
