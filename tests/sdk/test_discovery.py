"""``SessionEngine.count_consumers`` (service discovery) scripted without sockets: a
query is an idempotent read, so one pending when the link drops is asked again."""

from __future__ import annotations

import pytest

from holdfast.proto import pb
from holdfast.sdk.errors import InvalidQueueUriError, RequestFailedError, SessionClosedError

from .fakes import Harness


def queries(frames: list[pb.ClientFrame]) -> list[pb.CountConsumers]:
    return [f.count_consumers for f in frames if f.WhichOneof("frame") == "count_consumers"]


def answer(h: Harness, request_id: int, consumers: int, status: pb.Status = pb.STATUS_OK) -> None:
    h.feed(
        pb.ServerFrame(
            consumer_count=pb.ConsumerCount(
                request_id=request_id, status=status, consumers=consumers
            )
        )
    )


def test_a_query_is_answered_once_with_its_count() -> None:
    h = Harness()
    h.establish()
    request_id = h.engine.count_consumers("hf://test/service")
    (query,) = queries(h.sent_frames())
    assert (query.request_id, query.uri) == (request_id, "hf://test/service")
    answer(h, request_id, 3)
    answer(h, request_id, 5)  # a duplicate answer is ignored
    assert h.outcomes(request_id) == [None]
    assert h.engine.queries.take_answer(request_id) == 3
    assert h.engine.queries.take_answer(request_id) is None


def test_a_query_pending_when_the_link_drops_is_asked_again_after_hello() -> None:
    h = Harness()
    h.establish()
    request_id = h.engine.count_consumers("hf://test/service")
    h.sent_frames()
    h.lose()
    assert h.outcomes(request_id) == []
    frames = h.establish()
    assert [q.request_id for q in queries(frames)] == [request_id]
    answer(h, request_id, 1)
    assert h.engine.queries.take_answer(request_id) == 1


def test_a_query_made_while_disconnected_waits_for_the_link() -> None:
    h = Harness()
    request_id = h.engine.count_consumers("hf://test/service")
    assert queries(h.sent_frames()) == []
    assert [q.request_id for q in queries(h.establish())] == [request_id]


def test_a_refused_query_fails_typed_and_a_bad_uri_is_refused_locally() -> None:
    h = Harness()
    h.establish()
    request_id = h.engine.count_consumers("hf://test/service")
    answer(h, request_id, 0, pb.STATUS_INVALID_ARGUMENT)
    (error,) = h.outcomes(request_id)
    assert isinstance(error, RequestFailedError) and error.status == "INVALID_ARGUMENT"
    with pytest.raises(InvalidQueueUriError):
        h.engine.count_consumers("nope")


def test_closing_fails_pending_queries() -> None:
    h = Harness()
    request_id = h.engine.count_consumers("hf://test/service")
    h.engine.close()
    h.run_callbacks()
    (error,) = h.outcomes(request_id)
    assert isinstance(error, SessionClosedError)
