"""Scripted tests: ACK and PUSH batches whose columns agree on N but break the contract's
other rules are malformed frames (issue #33): the whole batch is refused before any of
it is applied, the connection ends, and nothing is lost.

- an ACK batch's queue_ids must be one per ACK or one for all (``holdfast.proto``,
  "Rules shared by every batch"), naming handles the client opened (handles are the
  client's to choose: a server naming another answers no PUT of this session);
- a PUSH's delivery count is 1 on first delivery, never 0; one message (queue handle
  and GUID) is never PUSHed twice in one batch, or it would reach the application
  twice and be confirmed twice.
"""

from __future__ import annotations

import uuid

import pytest

from holdfast.proto import pb
from holdfast.proto.columns import push_batch
from holdfast.sdk.engine import LinkState
from holdfast.sdk.errors import RemoteProtocolError
from holdfast.sdk.types import AckStatus

from .fakes import Harness, put_guids, reconnect

COUNT = 50


def _bad_queue_ids(queue_id: int) -> dict[str, tuple[list[int], str]]:
    return {
        "one too many": ([queue_id] * (COUNT + 1), f"{COUNT} messages with {COUNT + 1} queue_ids"),
        "three for fifty": ([queue_id] * 3, f"{COUNT} messages with 3 queue_ids"),
        "none": ([], f"{COUNT} messages with 0 queue_ids"),
        "never opened": ([77], "handle 77, which this client never opened"),
        "handle 0": ([0], "handle 0, which this client never opened"),
        "one of many never opened": (
            [queue_id] * (COUNT - 1) + [queue_id + 1],
            f"handle {queue_id + 1}, which",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "one too many",
        "three for fifty",
        "none",
        "never opened",
        "handle 0",
        "one of many never opened",
    ],
)
def test_an_ack_batch_with_bad_queue_ids_ends_the_connection_and_the_puts_go_again(
    case: str,
) -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active()
    guids = [h.post(queue_id) for _ in range(COUNT)]
    assert put_guids(h.sent_frames()) == guids
    queue_ids, complaint = _bad_queue_ids(queue_id)[case]
    packed = b"".join(g.bytes for g in guids)
    batch = pb.AckBatch(queue_ids=queue_ids, guids=packed)
    with pytest.raises(RemoteProtocolError, match=complaint):
        h.feed(pb.ServerFrame(acks=batch))
    h.run_callbacks()
    assert h.acks == []  # none of the batch is applied
    assert h.engine.pending_count == COUNT
    h.lose()  # what the shell does on RemoteProtocolError
    assert put_guids(reconnect(h)) == guids
    h.ack(*guids, queue_id=queue_id)
    assert [h.statuses(g) for g in guids] == [[AckStatus.SUCCESS]] * COUNT


def test_ack_batches_in_every_allowed_form_are_taken() -> None:
    """One handle for all, one per ACK over two queues, and an empty batch."""
    h = Harness()
    h.establish()
    first = h.open_active("hf://test/one")
    second = h.open_active("hf://test/two")
    a, b, c = h.post(first), h.post(second), h.post(first)
    mixed = pb.AckBatch(queue_ids=[first, second], guids=a.bytes + b.bytes)
    h.feed(pb.ServerFrame(acks=mixed))
    h.feed(pb.ServerFrame(acks=pb.AckBatch(queue_ids=[first], guids=c.bytes)))
    h.feed(pb.ServerFrame(acks=pb.AckBatch()))
    assert [h.statuses(g) for g in (a, b, c)] == [[AckStatus.SUCCESS]] * 3
    assert h.state() is LinkState.ACTIVE


def _push(queue_ids: list[int], guids: list[bytes], counts: list[int]) -> pb.ServerFrame:
    n = len(guids)
    return pb.ServerFrame(pushes=push_batch(queue_ids, guids, [b"p"] * n, counts, [0] * n))


@pytest.mark.parametrize(
    ("counts", "same_guid", "complaint"),
    [
        ([0, 0, 0, 0], False, "PUSH 0 of 4 has delivery count 0"),
        ([1, 2, 0, 1], False, "PUSH 2 of 4 has delivery count 0"),
        ([1, 1, 1, 1], True, "4 messages that carries one message twice"),
    ],
)
def test_a_push_batch_that_breaks_the_push_rules_is_refused_whole(
    counts: list[int], same_guid: bool, complaint: str
) -> None:
    h = Harness()
    h.establish()
    queue_id = h.open_active(read=True, write=False)
    guids = [uuid.uuid4().bytes for _ in range(4)]
    if same_guid:
        guids = [guids[0]] * 4
    with pytest.raises(RemoteProtocolError, match=complaint):
        h.feed(_push([queue_id] * 4, guids, counts))
    h.run_callbacks()
    assert h.messages == []  # nothing of the batch reaches the application
    h.lose()
    h.connect()
    h.answer_hello()
    h.answer_opens(h.sent_frames())
    assert h.state() is LinkState.ACTIVE
    good = [uuid.uuid4().bytes for _ in range(4)]
    h.feed(_push([queue_id] * 4, good, [1, 2, 1, 3]))
    h.run_callbacks()
    assert [(m.guid.bytes, m.delivery_count) for m in h.messages] == list(
        zip(good, [1, 2, 1, 3], strict=True)
    )


def test_one_guid_in_two_queues_of_one_push_batch_is_two_messages() -> None:
    """Dedup is per queue: the same GUID may be a message of two queues (a proxy's
    upstream session reads many queues), so only a (handle, GUID) pair twice is refused."""
    h = Harness()
    h.establish()
    first = h.open_active("hf://test/one", read=True, write=False)
    second = h.open_active("hf://test/two", read=True, write=False)
    guid = uuid.uuid4().bytes
    h.feed(_push([first, second], [guid, guid], [1, 1]))
    h.run_callbacks()
    assert [(m.guid.bytes, m.queue_uri) for m in h.messages] == [
        (guid, "hf://test/one"),
        (guid, "hf://test/two"),
    ]
