"""Rule 8's TOO_OLD on every store, directly and through the proxy: a PUT of an unknown
GUID older than the announced window plus its grace is refused ``TOO_OLD`` (the history
may have forgotten an earlier copy, so the broker cannot vouch for it), while one
within the window goes in; the proxy continues a PUT's age rather than restart it."""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
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
