"""Service discovery queries (``CountConsumers``), for ``SessionEngine``.

A query asks the broker how many live consumers a queue has (ZeroMQ Majordomo's
``mmi.service``); request/reply's ``Session.has_workers`` is built on it. Queries
are idempotent reads, so unlike CONFIRMs they survive a lost connection: a query
pending when the link drops is asked again after the next Hello.
"""

from __future__ import annotations

from collections.abc import Callable

from holdfast.proto import pb
from holdfast.proto.validate import InvalidUri, parse_queue_uri
from holdfast.sdk.errors import HoldfastError
from holdfast.sdk.statuses import invalid_error, request_error


class ConsumerQueries:
    """Pending ``CountConsumers`` requests and their answers, by request id."""

    def __init__(
        self,
        send: Callable[[pb.ClientFrame], None],
        complete: Callable[[list[int], HoldfastError | None], None],
    ) -> None:
        self._send = send
        self._complete = complete
        self._pending: dict[int, str] = {}
        self._answers: dict[int, int] = {}

    def ask(self, request_id: int, uri: str, connected: bool) -> None:
        """Ask for the consumers of ``uri`` now if ``connected``, else after the next Hello."""
        try:
            parse_queue_uri(uri)
        except InvalidUri as error:
            raise invalid_error(error) from None
        self._pending[request_id] = uri
        if connected:
            self._send_query(request_id, uri)

    def resend(self) -> None:
        """A new connection is up: ask every unanswered query again."""
        for request_id, uri in self._pending.items():
            self._send_query(request_id, uri)

    def answered(self, answer: pb.ConsumerCount) -> None:
        """The broker answered one query; a duplicate or stale answer is ignored."""
        if self._pending.pop(answer.request_id, None) is None:
            return
        if answer.status != pb.STATUS_OK:
            self._complete([answer.request_id], request_error(answer.status, answer.message))
            return
        self._answers[answer.request_id] = answer.consumers
        self._complete([answer.request_id], None)

    def take_answer(self, request_id: int) -> int | None:
        """The count for a query, once (None if it failed or is unanswered, and then
        it is dropped: the asker has given up waiting)."""
        self._pending.pop(request_id, None)
        return self._answers.pop(request_id, None)

    def end(self, error: HoldfastError) -> None:
        """The session ended: fail every unanswered query."""
        pending, self._pending = list(self._pending), {}
        self._complete(pending, error)

    def _send_query(self, request_id: int, uri: str) -> None:
        self._send(
            pb.ClientFrame(count_consumers=pb.CountConsumers(request_id=request_id, uri=uri))
        )
