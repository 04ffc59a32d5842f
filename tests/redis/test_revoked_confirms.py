"""CONFIRMs of revoked deliveries are refused with ``ConfirmRejected``, directly and
through the proxy alike (found by an outside tester: through the proxy the refusal
stopped at the proxy's upstream session, and the application heard nothing).

A node whose link to Redis is black-holed past its lease revokes its consumers'
deliveries (``DeliveriesRevoked``); a CONFIRM of one that reaches the node after that is
refused. Two consumers hold deliveries on the node; only the first confirms them, so
only the first may hear of a refusal: a proxy serves many clients and must tell the one
whose CONFIRMs they were.

The consumer confirms more revoked deliveries than ``--confirm-errors-per-second``
allows refused: they are the broker's doing, announced, so they end no session (found
by an outside tester: the broker ended the consumer's session, and through a proxy the
proxy's whole upstream session, every client's)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from holdfast.sdk import (
    ConfirmRejected,
    ConnectionLost,
    DeliveriesRevoked,
    QueueOptions,
    Session,
)
from tests.redis.fencing_kit import Deliveries, Events, redis_url_through
from tests.redis.test_fencing import LEASE, post, stalled
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.redis_server import RedisServer
from tests.support.sessions import FAST
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

URI = "hf://fence/orders"
HELD = 30
"""Deliveries each consumer holds."""
LIMIT = ["--confirm-errors-per-second", "10"]
"""Fewer refused CONFIRMs a second than the consumer has revoked deliveries to confirm
(broker and proxy alike)."""


def guids_of(
    events: Events, kind: type[ConfirmRejected] | type[DeliveriesRevoked]
) -> set[uuid.UUID]:
    """Every GUID the events of ``kind`` name."""
    named: set[uuid.UUID] = set()
    for event, _ in events.of(kind):
        assert isinstance(event, kind)
        named |= set(event.guids)
    return named


@contextlib.contextmanager
def holder(address: str) -> Iterator[tuple[Session, Deliveries, Events]]:
    """A consumer of ``URI`` on ``address`` that holds up to ``HELD`` deliveries."""
    events = Events()
    held = Deliveries(hold=True)
    with Session(address, options=FAST, on_event=events) as session:
        session.open_queue(
            URI, read=True, on_message=held, options=QueueOptions(max_unconfirmed_messages=HELD)
        )
        wait_until(lambda: held.count() >= HELD, 15, f"{HELD} deliveries held")
        yield session, held, events


@pytest.mark.parametrize("path", ["direct", "proxy"])
def test_confirms_of_revoked_deliveries_are_refused_to_their_client_and_end_no_session(
    tmp_path: Path, toxic_link: Callable[[str, str], Any], path: str
) -> None:
    with (
        RedisServer(tmp_path / "redis") as redis,
        contextlib.ExitStack() as stack,
    ):
        link = toxic_link("redis", redis.address)
        node = stack.enter_context(
            BrokerProcess(["--store", redis_url_through(link), "--redis-lease", str(LEASE), *LIMIT])
        )
        address = node.address
        proxy = None
        if path == "proxy":
            proxy = stack.enter_context(ProxyProcess(["--upstream", node.address, *LIMIT]))
            address = proxy.address
        post(node.address, 2 * HELD, "revoked")
        session, confirmer, confirmer_events = stack.enter_context(holder(address))
        other, bystander, bystander_events = stack.enter_context(holder(address))
        mine, theirs = set(confirmer.guids()), set(bystander.guids())
        assert len(mine) == len(theirs) == HELD and not mine & theirs
        with stalled(link):
            wait_until(
                lambda: (
                    guids_of(confirmer_events, DeliveriesRevoked) == mine
                    and guids_of(bystander_events, DeliveriesRevoked) == theirs
                ),
                20,
                "both consumers' deliveries revoked",
            )
            for message in confirmer.held:
                message.confirm()  # reaches the node after it revoked the delivery
            wait_until(
                lambda: guids_of(confirmer_events, ConfirmRejected) == mine,
                15,
                "the CONFIRMs refused to the consumer that sent them",
            )
            assert not bystander_events.of(ConfirmRejected)
        # A round trip on each session after the refusals (over the same upstream
        # session, through the proxy): an ending would have been heard before it.
        assert session.has_workers(URI, timeout=30) and other.has_workers(URI, timeout=30)
        assert not confirmer_events.of(ConnectionLost)
        assert not bystander_events.of(ConnectionLost)
        assert node.count("too many refused CONFIRMs") == 0
        if proxy is not None:
            assert proxy.count("ConnectionLost(") == 0, "the proxy's upstream session ended"
