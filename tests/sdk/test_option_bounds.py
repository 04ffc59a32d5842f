"""Option values the SDK cannot use are refused where they are given, typed.

Each of these used to be accepted and fail later, far from its cause: an infinite or
huge keepalive overflowed gRPC's 32-bit millisecond channel argument on every
connection attempt ("3 connections in a row ended by errors", blaming the server); a
huge connect timeout killed a timer thread; a token gRPC metadata cannot carry was
refused by gRPC at each call ("INTERNAL: Invalid metadata", C-core lines on stderr)
until the open timed out as "never connected".
"""

from __future__ import annotations

import math

import pytest

from holdfast.sdk import InvalidArgumentError, Session
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.backoff import Backoff
from holdfast.sdk.options import MAX_SECONDS, ReconnectOptions, SessionOptions
from tests.support.processes import BrokerProcess

pytestmark = pytest.mark.timeout(60)

HUGE = (math.inf, math.nan, 1e300, MAX_SECONDS * 1.001)


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("name", ["connect_timeout", "keepalive_time", "keepalive_timeout"])
def test_a_duration_past_a_day_is_refused_naming_it(name: str, value: float) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"^{name} must be > 0 and at most 86400"):
        SessionOptions(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("name", ["initial", "maximum"])
def test_a_back_off_past_a_day_is_refused_naming_it(name: str, value: float) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"^{name} must be > 0 and at most"):
        ReconnectOptions(**{name: value})


def test_an_infinite_multiplier_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="multiplier must be >= 1 and finite"):
        ReconnectOptions(multiplier=math.inf)


def test_the_back_off_stays_at_its_cap_however_long_the_outage() -> None:
    """multiplier**n overflowed after 1024 failed rounds (3.5 minutes of a broker down at
    the default cap): OverflowError, and the session failed."""
    options = ReconnectOptions(initial=0.05, maximum=0.2, multiplier=2.0, jitter=0.2)
    backoff = Backoff(options)
    delays = [backoff.next_delay() for _ in range(5000)]
    assert max(delays) <= 0.2 * 1.2
    assert min(delays[10:]) >= 0.2 * 0.8
    backoff.reset()
    assert backoff.next_delay() <= 0.05 * 1.2


def test_a_day_is_taken_and_a_session_works_with_it(broker: BrokerProcess) -> None:
    """The bound itself fits gRPC: 86,400,000 ms is a 32-bit channel argument."""
    options = SessionOptions(
        keepalive_time=MAX_SECONDS, keepalive_timeout=MAX_SECONDS, connect_timeout=MAX_SECONDS
    )
    with Session(broker.address, options=options) as session:
        queue = session.open_queue("hf://d/a-day", write=True, timeout=10)
        queue.post(b"x")
        assert session.flush(timeout=10)


@pytest.mark.parametrize("token", ["t\u00e9-token-123", "tok with space", "tok\nnewline", "\x7f"])
def test_a_token_grpc_cannot_send_is_refused_at_once(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOLDFAST_TOKEN", raising=False)
    with pytest.raises(InvalidArgumentError, match=r"^token: a token is printable ASCII"):
        SessionOptions(token=token)
    with pytest.raises(InvalidArgumentError, match=r"^token: a token is printable ASCII"):
        AdminClient("127.0.0.1:1", token=token)
    monkeypatch.setenv("HOLDFAST_TOKEN", token)
    with pytest.raises(InvalidArgumentError, match=r"^\$HOLDFAST_TOKEN: a token is printable"):
        SessionOptions()
    with pytest.raises(InvalidArgumentError, match=r"^\$HOLDFAST_TOKEN: a token is printable"):
        AdminClient("127.0.0.1:1")


def test_a_token_of_printable_ascii_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOLDFAST_TOKEN", raising=False)
    assert SessionOptions(token="A-z_0.9~!#").token == "A-z_0.9~!#"
    assert SessionOptions(token=None).token is None


@pytest.mark.parametrize("timeout", [math.inf, math.nan, 1e300, 0.0])
def test_an_admin_timeout_grpc_cannot_time_is_refused(timeout: float) -> None:
    """gRPC made an infinite or huge timeout a deadline already past: DEADLINE_EXCEEDED."""
    with pytest.raises(InvalidArgumentError, match=r"^timeout must be > 0 and at most 86400"):
        AdminClient("127.0.0.1:1", timeout=timeout)
