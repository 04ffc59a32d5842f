"""The manager answers the calls of a key whose worker cannot start only into a
caller's reply queue of the pool's domain (issue #17): its token (admin, often every
domain) must not post, for a caller, where the caller may not. Its workers refuse the
same requests (``Worker``; ``tests/rpc/test_reply_to.py``)."""

from __future__ import annotations

import logging
import sys

import pytest

from holdfast.sdk import Session, WorkerStartError
from holdfast.sdk.admin import AdminClient
from holdfast.sdk.errors import QueueNotFoundError
from holdfast.sdk.poolnames import key_queue_uri
from holdfast.sdk.rpc import wire
from tests.pools.support import running_manager
from tests.support.processes import BrokerProcess
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(90)

POOL = "hf://infra/deputy"
LEDGER = "hf://billing/ledger"


def test_a_start_failure_is_not_answered_into_a_queue_of_another_domain(
    broker: BrokerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    command = [sys.executable, "-c", "import sys; sys.exit(4)"]
    caplog.set_level(logging.WARNING, "holdfast.pool.startfail")
    with (
        running_manager(broker.address, POOL, command),
        Session(broker.address, options=FAST) as session,
    ):
        forged = {wire.REPLY_TO: LEDGER, wire.EXPIRES: "0", wire.KEY: "k1"}
        session.open_queue(key_queue_uri(POOL, "k1"), write=True).post(b"forged", forged)
        with pytest.raises(WorkerStartError):
            session.request(POOL, b"x", key="k1", timeout=60)

        def refused() -> bool:
            return any(
                LEDGER in r.getMessage() and "outside the service's domain" in r.getMessage()
                for r in caplog.records
            )

        wait_until(refused, 30, "the forged request to be dropped with a warning")
    with AdminClient(broker.address) as admin:
        try:
            ready = admin.stats(LEDGER).ready
        except QueueNotFoundError:
            ready = 0
    assert ready == 0
