"""The contract's checks, shared by the SDK, the proxy and the broker."""

from __future__ import annotations

import pytest

from holdfast.proto import pb
from holdfast.proto.limits import Limits
from holdfast.proto.validate import (
    Invalid,
    InvalidUri,
    QueueUri,
    check_open,
    check_payload,
    check_properties,
    parse_queue_uri,
    properties_problem,
    properties_size,
    put_status,
    quote,
)

GUID = bytes(16)


def test_quote_keeps_short_input_and_cuts_long_input() -> None:
    assert quote("hf://d/q") == "'hf://d/q'"
    assert quote(b"ab") == "b'ab'"
    long = quote("x" * 3_000_000)
    assert long.startswith("'" + "x" * 64 + "'")
    assert long.endswith("... (3000000 characters)")
    assert len(long) < 100
    assert quote(b"\x00" * 1000, limit=4) == "b'\\x00\\x00\\x00\\x00'... (1000 bytes)"
    assert len(quote(list(range(100_000)))) < 100


def test_queue_uri_parses_domain_and_queue() -> None:
    assert parse_queue_uri("hf://orders.eu/in_1") == QueueUri("orders.eu", "in_1")
    assert str(QueueUri("d", "q")) == "hf://d/q"


@pytest.mark.parametrize("uri", ["hf://d/q\n", "hf://d/q\r\n", "\nhf://d/q", "hf://d/q "])
def test_queue_uri_refuses_anything_around_it_even_a_trailing_newline(uri: str) -> None:
    with pytest.raises(InvalidUri) as raised:
        parse_queue_uri(uri)
    assert raised.value.status == pb.STATUS_INVALID_ARGUMENT


def test_queue_uri_error_quotes_a_bounded_prefix() -> None:
    with pytest.raises(InvalidUri) as raised:
        parse_queue_uri("hf://d/" + "\x00" * (3 * 1024 * 1024))
    assert len(raised.value.message) < 400
    assert "(3145735 characters)" in raised.value.message


def test_queue_uri_must_be_a_string() -> None:
    with pytest.raises(InvalidUri, match="must be a string, not bytes"):
        parse_queue_uri(b"hf://d/q")


def test_open_needs_a_valid_uri_and_read_or_write() -> None:
    assert check_open("hf://d/q", read=True, write=False) == QueueUri("d", "q")
    with pytest.raises(Invalid, match="read, write or both") as raised:
        check_open("hf://d/q", read=False, write=False)
    assert raised.value.status == pb.STATUS_INVALID_ARGUMENT
    with pytest.raises(InvalidUri):
        check_open("hf://d", read=True, write=True)


def test_property_bytes_are_utf8_keys_plus_values_and_nothing_else() -> None:
    # One rule for the SDK and the broker: no per-property overhead is counted.
    assert properties_size({"k": "é", "ab": ""}) == 1 + 2 + 2
    limits = Limits(max_properties=2, max_properties_bytes=5)
    assert properties_problem({"k": "é", "ab": ""}, limits) is None
    assert check_properties({"k": "é", "ab": ""}, limits) == ({"k": "é", "ab": ""}, 5)
    assert properties_problem({"k": "é", "abc": ""}, limits) is not None
    with pytest.raises(Invalid, match="6 bytes, over the limit of 5") as raised:
        check_properties({"k": "é", "abc": ""}, limits)
    assert raised.value.status == pb.STATUS_INVALID_PROPERTIES


def test_property_count_is_limited() -> None:
    limits = Limits(max_properties=1)
    assert properties_problem({"a": "1", "b": "2"}, limits) == ("2 properties, over the limit of 1")
    with pytest.raises(Invalid, match="2 properties"):
        check_properties({"a": "1", "b": "2"}, limits)


@pytest.mark.parametrize(
    ("properties", "match"),
    [
        ([("k", "v")], "must be a mapping"),
        ({"k": 1}, "must map str to str, not str to int"),
        ({1: "v"}, "must map str to str, not int to str"),
        ({"k": "\ud800"}, "lone surrogate"),
    ],
)
def test_application_properties_must_be_str_to_str_in_utf8(properties: object, match: str) -> None:
    with pytest.raises(Invalid, match=match) as raised:
        check_properties(properties, Limits())
    assert raised.value.status == pb.STATUS_INVALID_PROPERTIES


def test_a_long_bad_property_key_is_quoted_briefly() -> None:
    with pytest.raises(Invalid) as raised:
        check_properties({b"k" * 100_000: "v"}, Limits())
    assert len(raised.value.message) < 200


def test_payload_limit() -> None:
    limits = Limits(max_payload_bytes=3)
    check_payload(b"abc", limits)
    with pytest.raises(Invalid, match="4 bytes is over the limit of 3") as raised:
        check_payload(b"abcd", limits)
    assert raised.value.status == pb.STATUS_PAYLOAD_TOO_LARGE


def test_put_status_checks_guid_then_payload_then_properties() -> None:
    limits = Limits(max_payload_bytes=3, max_properties=1)
    assert put_status(GUID, b"abc", {"k": "v"}, limits) == pb.STATUS_OK
    assert put_status(bytes(15), b"abc", {}, limits) == pb.STATUS_INVALID_GUID
    assert put_status(bytes(17), b"abc", {}, limits) == pb.STATUS_INVALID_GUID
    assert put_status(GUID, b"abcd", {}, limits) == pb.STATUS_PAYLOAD_TOO_LARGE
    assert put_status(GUID, b"", {"a": "", "b": ""}, limits) == pb.STATUS_INVALID_PROPERTIES
