"""A consumer's flow limits on every store, directly and through the proxy: delivery
stops while it holds ``max_unconfirmed_messages`` messages or ``max_unconfirmed_bytes``
payload bytes (a message goes while the bytes held before it are under the limit), and
each CONFIRM lets in what fits again. The broker's batch path for a queue's one
consumer (``broker.delivery.to_one``) must keep this rule exactly."""

from __future__ import annotations

import pytest

from holdfast.sdk import QueueOptions
from tests.conformance.harness import World
from tests.conformance.support import Inbox

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(60)]

QUIET = 1.0
"""Seconds a consumer at its limit is watched for a PUSH it must not get."""


def no_more_than(inbox: Inbox, count: int) -> None:
    """No delivery past ``count`` arrives within ``QUIET`` seconds (a bounded wait)."""
    with pytest.raises(AssertionError, match="timed out"):
        inbox.wait(count + 1, timeout=QUIET)


@pytest.mark.parametrize(
    ("options", "held"),
    [
        (QueueOptions(max_unconfirmed_messages=2), 2),
        # 0, 100 and 200 bytes held before each are under 250; 300 is not.
        (QueueOptions(max_unconfirmed_messages=100, max_unconfirmed_bytes=250), 3),
    ],
    ids=["messages", "bytes"],
)
def test_a_consumer_takes_while_under_its_limits_and_one_more_per_confirm(
    world: World, options: QueueOptions, held: int
) -> None:
    uri = world.uri("flow")
    with world.session() as producer:
        queue = producer.open_queue(uri, write=True)
        for n in range(6):
            queue.post(bytes([n]) * 100)
        assert producer.flush(timeout=15)
    with world.session() as consumer:
        inbox = Inbox()
        consumer.open_queue(uri, read=True, on_message=inbox, options=options)
        first = inbox.wait(held)
        no_more_than(inbox, held)
        first[0].confirm()
        assert [m.payload[0] for m in inbox.wait(held + 1)] == list(range(held + 1))
        no_more_than(inbox, held + 1)
