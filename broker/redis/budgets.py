"""Per-token staging budgets on the Redis store: the rows and bytes each token has
staged, over every queue, in ``hf:stbudget:{<token>}`` (a slot of its own, so taken and
given back by scripts of their own around the queue's staging script: a stage call
takes before it stages and gives back what it did not add; a commit, an abort or an
expiry gives back what left). The key expires with the token's staged rows (twice the
retention after its last stage call): a node that died between taking and staging
leaves at most that call's amount behind until then."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from holdfast.broker.redis import staging_side_scripts as side
from holdfast.broker.redis.client import RedisClient
from holdfast.broker.redis.script import rows as rows_of
from holdfast.broker.redis.script import text
from holdfast.broker.staging import StagedRow, StagingLimits


def budget_key(token: str) -> str:
    """The key of a token's staging budget (a slot of its own)."""
    return "hf:stbudget:{" + token + "}"


class TokenBudgets:
    """Takes and gives back the tokens' staging budgets."""

    def __init__(self, client: RedisClient, limits: StagingLimits, ttl_ms: int) -> None:
        self._client = client
        self._limits = limits
        self._ttl_ms = ttl_ms

    async def _take(self, budget: str, rows: int, size: int) -> bool:
        """Take ``rows`` and ``size`` bytes from ``budget``; False if it cannot hold them."""
        limits = self._limits
        took = await self._client.run(
            side.take_budget(
                budget,
                rows=rows,
                size=size,
                max_rows=limits.max_rows_per_token,
                max_bytes=limits.max_bytes_per_token,
                ttl_ms=self._ttl_ms,
            )
        )
        return bool(int(took[0]))

    async def take(
        self, token: str, attempt: str, batch: Mapping[bytes, StagedRow], size: int
    ) -> tuple[int, int] | None:
        """Take the rows and bytes ``batch`` may add from the token's budget; None if it
        cannot hold them. First the whole batch (one call); at the edge of the budget,
        only what the batch adds to its attempt (a retried call adds nothing), counted
        by another call: the budget's key is in another slot than the attempt's."""
        budget = budget_key(token)
        if await self._take(budget, len(batch), size):
            return len(batch), size
        sizes = [(guid, len(put.payload)) for guid, put in batch.items()]
        counted = await self._client.run(side.count_new(attempt, sizes=sizes))
        rows, delta = (int(n) for n in counted)
        want = (rows, max(delta, 0))
        if want == (0, 0):
            return want
        return want if await self._take(budget, *want) else None

    async def give(self, token: str, rows: int, size: int) -> None:
        """Give ``rows`` and ``size`` bytes back to ``token`` (negative: take them, come
        what may: a stage added more than it took)."""
        await self._client.run(side.give_budget(budget_key(token), rows=rows, size=size))

    async def give_back(self, released: Sequence[Any]) -> None:
        """Give the rows and bytes of attempts that left (``released``: token, rows,
        bytes of each, as the scripts return them) back to their tokens."""
        totals: Counter[tuple[str, str]] = Counter()
        for raw_token, rows, size in rows_of(released, 3):
            token = text(raw_token)
            totals[(token, "rows")] += int(rows)
            totals[(token, "bytes")] += int(size)
        for token in {token for token, _ in totals}:
            rows, size = totals[(token, "rows")], totals[(token, "bytes")]
            if rows or size:
                await self.give(token, rows, size)


__all__ = ["TokenBudgets", "budget_key"]
