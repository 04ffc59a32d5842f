"""The request/reply wire format: derived reply GUIDs and reserved properties."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto.policy import DEAD_GUID
from holdfast.sdk import InvalidArgumentError, InvalidPropertiesError, WorkerOptions
from holdfast.sdk.guids import Uuid7Source
from holdfast.sdk.rpc import wire


def test_reply_guid_is_a_deterministic_uuid8_distinct_per_request() -> None:
    source = Uuid7Source()
    requests = [source.next()[0] for _ in range(1000)]
    replies = [wire.reply_guid(guid) for guid in requests]
    assert replies == [wire.reply_guid(guid) for guid in requests]  # a retried worker agrees
    assert len(set(replies)) == 1000
    assert not set(replies) & set(requests)
    assert {guid.version for guid in replies} == {8}
    assert {guid.variant for guid in replies} == {uuid.RFC_4122}


def test_reserved_names_are_refused_and_hidden() -> None:
    with pytest.raises(InvalidPropertiesError, match="names starting with 'x-rpc-' are"):
        wire.check_user_properties({"x-rpc-kind": "reply"})
    # The call's own policy properties are named, not the x-rpc- prefix they lack (the
    # check of a request's properties and of a handler's reply, on both front-ends).
    for name in ("x-ttl-ms", "x-dead-letter-notify"):
        with pytest.raises(InvalidPropertiesError, match=f"^property '{name}' is reserved: "):
            wire.check_user_properties({"k": "v", name: "5"})
    assert wire.check_user_properties({"k": "v"}) == {"k": "v"}
    properties = wire.request_properties({"k": "v"}, "hf://a/reply", 123, "key-1")
    assert wire.user_properties(properties) == {"k": "v"}
    assert properties[wire.KEY] == "key-1"


def test_a_request_header_that_does_not_parse_is_refused_with_a_bounded_message() -> None:
    with pytest.raises(ValueError):
        wire.parse_request({wire.REPLY_TO: "not a uri"})
    with pytest.raises(ValueError) as caught:
        wire.parse_request({wire.REPLY_TO: "hf://a/b", wire.EXPIRES: "x" * 10_000})
    assert len(str(caught.value)) < 200
    assert wire.parse_request({wire.REPLY_TO: "hf://a/b", wire.EXPIRES: "5"}).expires_ms == 5


@pytest.mark.parametrize(
    "text",
    [
        uuid.UUID(int=7).hex,
        str(uuid.UUID(int=7)),  # hyphenated, as uuid.UUID(hex=) also reads it
        "{" + uuid.UUID(int=7).hex + "}",
        "",
        "zz" * 16,  # 32 characters, not hex
        " " + uuid.UUID(int=7).hex[1:],  # 32 characters with a blank: 15 bytes
        "ab" * 8,
    ],
)
def test_request_key_reads_what_parse_request_guid_reads(text: str) -> None:
    for name in (wire.REQUEST, DEAD_GUID):  # a reply or heartbeat; the broker's notice
        guid = wire.parse_request_guid({name: text})
        assert wire.request_key({name: text}) == (None if guid is None else guid.bytes)


def test_worker_options_are_checked() -> None:
    with pytest.raises(InvalidArgumentError):
        WorkerOptions(heartbeat_interval=0)
    with pytest.raises(InvalidArgumentError):
        WorkerOptions(max_replies=0)
