"""Rule 8's TOO_OLD on every store, directly and through the proxy: a PUT of an unknown
GUID older than the announced window plus its grace is refused ``TOO_OLD`` (the history
may have forgotten an earlier copy, so the broker cannot vouch for it), while one
within the window goes in; the proxy continues a PUT's age rather than restart it."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import reject_batch
from tests.conformance.harness import World
from tests.conformance.support import peek
from tests.support.wire_client import WireClient

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(60)]


def test_an_unknown_guid_older_than_the_window_is_too_old_and_a_young_one_goes_in(
    world: World,
) -> None:
    uri = world.uri("too-old")
    with WireClient(world.address) as client:
        window_ms = client.hello().dedup_window_ms
        assert client.open(1, uri, write=True).status == pb.STATUS_OK
        old, young = uuid.uuid4().bytes, uuid.uuid4().bytes
        # A day past the window: past any grace the broker adds to it.
        client.put(1, [(old, b"old", {})], age_ms=window_ms + 86_400_000)
        client.put(1, [(young, b"young", {})], age_ms=1)
        statuses = {ack.guid: ack.status for ack in client.acks(2)}
    assert statuses == {old: pb.STATUS_TOO_OLD, young: pb.STATUS_OK}
    assert [m.payload for m in peek(world, uri)] == [b"young"]


def test_ages_and_reject_delays_at_the_top_of_uint64_harm_nobody(world: World) -> None:
    """A client's PUT aged 2**64-1 ms is TOO_OLD, and its REJECT delayed 2**64-1 ms is
    cut to the longest delay, on every path: through the proxy either one used to stop
    the proxy's upstream for every client (the age or delay, made a float and back,
    overflowed the uint64 of the upstream frame, and the upstream task died silently)."""
    uri = world.uri("uint64")
    top = 2**64 - 1
    with WireClient(world.address) as client, world.session() as bystander:
        client.hello()
        assert client.open(1, uri, write=True, read=True).status == pb.STATUS_OK
        old, kept = uuid.uuid4().bytes, uuid.uuid4().bytes
        client.put(1, [(old, b"old", {})], age_ms=top)
        client.put(1, [(kept, b"kept", {})])
        statuses = {ack.guid: ack.status for ack in client.acks(2)}
        assert statuses == {old: pb.STATUS_TOO_OLD, kept: pb.STATUS_OK}
        (push,) = client.pushes(1)
        client.send(pb.ClientFrame(rejects=reject_batch([(1, push.guid, True, top)])))
        client.barrier()
        # The proxy's upstream still works, for this client and for another one.
        after = uuid.uuid4().bytes
        client.put(1, [(after, b"after", {})])
        assert [(a.guid, a.status) for a in client.acks(1)] == [(after, pb.STATUS_OK)]
        queue = bystander.open_queue(world.uri("bystander"), write=True, timeout=10)
        queue.post(b"b")
        assert bystander.flush(10)
