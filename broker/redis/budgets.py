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

from holdfast.broker.redis import staging_scripts
from holdfast.broker.redis.client import RedisClient
from holdfast.broker.staging import StagingLimits
from holdfast.proto import pb


def budget_key(token: str) -> str:
    """The key of a token's staging budget (a slot of its own)."""
    return "hf:stbudget:{" + token + "}"


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class TokenBudgets:
    """Takes and gives back the tokens' staging budgets."""

    def __init__(self, client: RedisClient, limits: StagingLimits, ttl_ms: int) -> None:
        self._client = client
        self._caps = (limits.max_rows_per_token, limits.max_bytes_per_token)
        self._ttl_ms = ttl_ms
        self._scripts = {
            name: client.redis.register_script(getattr(staging_scripts, name))
            for name in ("TAKE_BUDGET", "GIVE_BUDGET", "COUNT_NEW")
        }

    async def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        return await self._client.script(name, self._scripts[name], keys, args)

    async def take(
        self, token: str, attempt: str, batch: Mapping[bytes, pb.Put], size: int
    ) -> tuple[int, int] | None:
        """Take the rows and bytes ``batch`` may add from the token's budget; None if it
        cannot hold them. First the whole batch (one call); at the edge of the budget,
        only what the batch adds to its attempt (a retried call adds nothing), counted
        by another call: the budget's key is in another slot than the attempt's."""
        budget = budget_key(token)
        caps = (*self._caps, self._ttl_ms)
        took = await self._run("TAKE_BUDGET", [budget], [len(batch), size, *caps])
        if int(took[0]):
            return len(batch), size
        sizes: list[Any] = []
        for guid, put in batch.items():
            sizes += [guid, len(put.payload)]
        rows, delta = (int(n) for n in await self._run("COUNT_NEW", [attempt], sizes))
        want = (rows, max(delta, 0))
        if want == (0, 0):
            return want
        took = await self._run("TAKE_BUDGET", [budget], [*want, *caps])
        return want if int(took[0]) else None

    async def give(self, token: str, rows: int, size: int) -> None:
        """Give ``rows`` and ``size`` bytes back to ``token`` (negative: take them, come
        what may: a stage added more than it took)."""
        await self._run("GIVE_BUDGET", [budget_key(token)], [rows, size])

    async def give_back(self, released: Sequence[Any]) -> None:
        """Give the rows and bytes of attempts that left (``released``: token, rows,
        bytes of each, as the scripts return them) back to their tokens."""
        totals: Counter[tuple[str, str]] = Counter()
        for i in range(0, len(released), 3):
            token = _text(released[i])
            totals[(token, "rows")] += int(released[i + 1])
            totals[(token, "bytes")] += int(released[i + 2])
        for token in {token for token, _ in totals}:
            rows, size = totals[(token, "rows")], totals[(token, "bytes")]
            if rows or size:
                await self.give(token, rows, size)


__all__ = ["TokenBudgets", "budget_key"]
