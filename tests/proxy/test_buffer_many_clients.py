"""``--max-buffer-bytes`` holds however many clients send a frame at once.

Each idle client waits in a read of its stream, so when many send a large frame
together during an outage, every frame is read. The proxy buffers only what fits the
bound and its slack; the PUTs of the other frames are answered ``LIMIT_EXCEEDED``,
kept by their sessions and sent again, and each reaches the broker once it is back.
(Before: each client holding nothing had one frame buffered whatever the total, so six
sessions of 0.4-MiB frames took a 1-MiB bound to 2.3 MiB.)
"""

from __future__ import annotations

import os
import uuid

import pytest

from holdfast.sdk import AckStatus, Session, SessionOptions
from tests.proxy.test_buffer_bound import bounded_proxy, buffered
from tests.support.metrics import metrics_address, scrape, value
from tests.support.processes import BrokerProcess
from tests.support.recorder import AckRecorder
from tests.support.sessions import FAST, unique_uri
from tests.support.waiting import wait_until

BOUND = 1024 * 1024
CLIENTS = 6
PUTS = 80
"""PUTs of 4 KiB each session posts at once: one frame, charged about 0.4 MiB."""

OPTIONS = SessionOptions(reconnect=FAST.reconnect, max_batch_bytes=2 * 1024 * 1024)


def read(metrics: str) -> float:
    """PUTs the proxy has read: relayed upstream, or pushed back."""
    samples = scrape(metrics)
    relayed = value(samples, "holdfast_proxy_puts_relayed_total") or 0
    return relayed + (
        value(samples, "holdfast_proxy_acks_relayed_total", status="LIMIT_EXCEEDED") or 0
    )


@pytest.mark.timeout(150)
def test_many_clients_sending_a_frame_at_once_stay_within_the_bound_and_slack() -> None:
    uri = unique_uri("many")
    payload = os.urandom(4096)
    with (
        BrokerProcess() as broker,
        bounded_proxy(broker, BOUND) as proxy,
    ):
        metrics = metrics_address(proxy)
        sessions = [Session(proxy.address, options=OPTIONS) for _ in range(CLIENTS)]
        try:
            recorders = [AckRecorder() for _ in sessions]
            queues = [
                session.open_queue(uri, write=True, on_ack=acks)
                for session, acks in zip(sessions, recorders, strict=True)
            ]
            broker.kill()
            posted: list[list[uuid.UUID]] = [q.post_many([payload] * PUTS) for q in queues]
            # Every session's frame has been read: buffered, or pushed back.
            wait_until(lambda: read(metrics) >= CLIENTS * PUTS, 30, "every frame to be read")
            ceiling = BOUND + BOUND // 8
            assert buffered(metrics, "holdfast_proxy_buffered_bytes_peak") <= ceiling
            assert buffered(metrics, "holdfast_proxy_buffer_refused_frames_total") >= 1

            broker.restart()
            for session in sessions:
                assert session.flush(timeout=60)
            assert buffered(metrics, "holdfast_proxy_buffered_bytes_peak") <= ceiling
            for acks, guids in zip(recorders, posted, strict=True):
                assert acks.with_status(AckStatus.SUCCESS) == set(guids)
        finally:
            for session in sessions:
                session.close(timeout=1)
