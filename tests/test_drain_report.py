"""The drain helper's report when fewer messages arrive than a test expects: how many
arrived, and what the broker still holds of the queue, so a failed run says whether
delivery stalled or messages were lost."""

from __future__ import annotations

import threading

import pytest

from holdfast.sdk import Session
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST, drain_messages, unique_uri


@pytest.mark.timeout(60)
def test_a_drain_that_times_out_says_what_arrived_and_what_the_broker_holds(
    broker: BrokerProcess,
) -> None:
    uri = unique_uri("drain-report")
    with Session(broker.address, options=FAST) as session:
        queue = session.open_queue(uri, write=True)
        for n in range(3):
            queue.post(b"%d" % n)
        assert session.flush(timeout=10)
    with pytest.raises(AssertionError) as failed:
        drain_messages(broker.address, uri, 5, timeout=1.0)
    report = str(failed.value)
    assert "3 arrived (3 distinct)" in report, report
    assert "the broker holds 0 ready and 0 unconfirmed, accepted 3" in report, report


@pytest.mark.timeout(60)
def test_the_report_says_so_when_the_broker_cannot_be_asked(broker: BrokerProcess) -> None:
    # Killed while the drain waits: its queue is open, the admin call then fails.
    killer = threading.Timer(0.5, broker.kill)
    killer.start()
    try:
        with pytest.raises(AssertionError) as failed:
            drain_messages(broker.address, unique_uri("drain-report-gone"), 1, timeout=1.5)
    finally:
        killer.join()
    assert "0 arrived (0 distinct); the broker's figures are not to be had" in str(failed.value)
