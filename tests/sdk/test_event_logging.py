"""The default event handler logs one line per event, and failed connection attempts
(several a second while a server is down) at most once per interval per address."""

from __future__ import annotations

import logging
import time

import pytest

from holdfast.sdk import events
from holdfast.sdk.events import ConnectAttemptFailed, Connected, log_event


def test_failed_attempts_are_rate_limited_per_address_and_stay_one_line(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(events, "_attempts", {})
    reason = "UNAVAILABLE: failed to connect\n  to all addresses;\n  last error: refused"
    with caplog.at_level(logging.INFO, logger="holdfast.sdk"):
        for _ in range(40):  # 4 a second for 10 s
            log_event(ConnectAttemptFailed("127.0.0.1:7700", reason, 0.25))
            clock[0] += 0.25
        log_event(ConnectAttemptFailed("127.0.0.1:7700", reason, 0.25))
        log_event(ConnectAttemptFailed("127.0.0.1:7711", reason, 0.25))  # another address
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert all("\n" not in line for line in lines)
    assert lines[0].startswith("cannot connect to 127.0.0.1:7700: UNAVAILABLE: failed to connect")
    assert "(39 more failed attempts not logged)" in lines[1]
    assert "127.0.0.1:7711" in lines[2]


def test_a_successful_connection_resets_the_limit(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(events, "_attempts", {})
    with caplog.at_level(logging.INFO, logger="holdfast.sdk"):
        log_event(ConnectAttemptFailed("h:1", "refused", 0.1))
        log_event(Connected("h:1", "broker-1"))
        log_event(ConnectAttemptFailed("h:1", "refused", 0.1))
    assert sum("cannot connect" in r.getMessage() for r in caplog.records) == 2
