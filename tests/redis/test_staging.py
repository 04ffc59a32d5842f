"""Transactional writes on the Redis store, seen in Redis itself: two broker nodes share
staged rows and commit marks; a commit is atomic (two nodes committing one version at
once publish it once); a version committed once stays committed after its GUIDs left
the dedup history; every staging key but the commit marks carries a TTL, and the
sweep takes emptied queues off its list; with too few replicas nothing is reported
done; a call made while a long commit script holds Redis waits for it."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable

import pytest
import redis as redis_sync

from holdfast.broker.redis.budgets import budget_key
from holdfast.broker.redis.client import RedisClient, parse_redis_spec
from holdfast.broker.redis.keys import QueueKeys
from holdfast.broker.redis.marks import RedisMarks
from holdfast.broker.redis.registry import RedisRegistry
from holdfast.broker.redis.staging import STAGED_QUEUES, RedisStaging
from holdfast.broker.staging import (
    ANONYMOUS_TOKEN,
    AttemptKey,
    StagedRow,
    StageOutcome,
    StagingLimits,
)
from holdfast.broker.store import StoreError
from holdfast.proto import pb
from holdfast.proto.policy import PICKUP_TTL, QueuePolicy
from tests.redis.lifecycle_world import Clock

pytestmark = pytest.mark.timeout(60)

RETENTION = 30.0


Nodes = tuple[RedisClient, RedisStaging, RedisStaging, Clock]


def run(redis_url: str, test: Callable[[Nodes], Awaitable[None]]) -> None:
    """Run ``test`` with two nodes' staging on one Redis, on a manual clock."""

    async def main() -> None:
        client = RedisClient(parse_redis_spec(redis_url), retry_window=5.0)
        clock = Clock()
        limits = StagingLimits(retention=RETENTION)
        nodes = [
            RedisStaging(client, RedisRegistry(client, f"node-{n}", clock), limits, 600_000)
            for n in ("a", "b")
        ]
        try:
            await test((client, nodes[0], nodes[1], clock))
        finally:
            await client.close()

    asyncio.run(main())


def puts(tag: str, count: int) -> list[StagedRow]:
    return [
        StagedRow(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-{i}").bytes, f"{tag}{i}".encode(), {})
        for i in range(count)
    ]


def test_one_node_stages_another_commits_and_both_see_the_mark(redis_url: str) -> None:
    async def test(nodes: Nodes) -> None:
        client, a, b, clock = nodes
        uri, app = f"hf://staging/shared-{uuid.uuid4().hex[:8]}", "app"
        assert await a.stage(AttemptKey(uri, app, 3, 0, 1), puts("p", 20), ANONYMOUS_TOKEN) is (
            StageOutcome.STAGED
        )
        assert await client.redis.llen(QueueKeys(uri).ready) == 0
        reply = await b.commit(uri, app, 3, {(0, 1): 20}, b"digest", 20)
        assert (reply.status, reply.published) == (pb.STATUS_OK, 20)
        mark = await RedisMarks(client, clock).handle(
            pb.CommitMarkRequest(queue_uri=uri, app_id=app)
        )
        assert (mark.found, mark.mark.version, mark.mark.digest, mark.mark.rows) == (
            True,
            3,
            b"digest",
            20,
        )
        assert await a.stage(AttemptKey(uri, app, 2, 0, 9), puts("old", 1), ANONYMOUS_TOKEN) is (
            StageOutcome.COMMITTED
        )

    run(redis_url, test)


def test_two_nodes_committing_one_version_at_once_publish_it_once(redis_url: str) -> None:
    async def test(nodes: Nodes) -> None:
        client, a, b, _ = nodes
        uri, app = f"hf://staging/race-{uuid.uuid4().hex[:8]}", "app"
        await a.stage(AttemptKey(uri, app, 0, 0, 0), puts("r", 500), ANONYMOUS_TOKEN)
        await a.stage(AttemptKey(uri, app, 0, 0, 1), puts("r", 500), ANONYMOUS_TOKEN)
        replies = await asyncio.gather(
            a.commit(uri, app, 0, {(0, 0): 500}, b"d", 500),
            b.commit(uri, app, 0, {(0, 0): 500}, b"d", 500),
        )
        assert sorted(r.committed_before for r in replies) == [False, True]
        assert sum(r.published for r in replies) == 500
        assert sum(r.discarded for r in replies) == 500  # attempt 1, once
        assert await client.redis.llen(QueueKeys(uri).ready) == 500

    run(redis_url, test)


def test_a_replay_after_the_dedup_history_expired_adds_nothing(redis_url: str) -> None:
    async def test(nodes: Nodes) -> None:
        client, a, b, _ = nodes
        uri, app = f"hf://staging/late-{uuid.uuid4().hex[:8]}", "app"
        await a.stage(AttemptKey(uri, app, 5, 0, 0), puts("l", 30), ANONYMOUS_TOKEN)
        assert (await a.commit(uri, app, 5, {(0, 0): 30}, b"d", 30)).published == 30
        # The history is gone (its TTL passed) and the messages were consumed.
        queue = QueueKeys(uri)
        history = [k async for k in client.redis.scan_iter(match=queue.prefix + "g:*")]
        assert len(history) == 30
        await client.redis.delete(*history, queue.ready, queue.body, queue.meta)
        assert await b.stage(AttemptKey(uri, app, 5, 0, 7), puts("l", 30), ANONYMOUS_TOKEN) is (
            StageOutcome.COMMITTED
        )
        again = await b.commit(uri, app, 5, {(0, 7): 30}, b"d", 30)
        assert again.committed_before and again.published == 0
        assert await client.redis.llen(queue.ready) == 0

    run(redis_url, test)


def test_staging_keys_expire_and_an_emptied_queue_leaves_the_sweep(redis_url: str) -> None:
    async def test(nodes: Nodes) -> None:
        client, a, _, clock = nodes
        uri, app = f"hf://staging/ttl-{uuid.uuid4().hex[:8]}", "app"
        await a.stage(AttemptKey(uri, app, 0, 0, 0), puts("t", 5), ANONYMOUS_TOKEN)
        await a.stage(AttemptKey(uri, app, 0, 1, 0), puts("u", 5), ANONYMOUS_TOKEN)
        await RedisMarks(client, clock).handle(
            pb.CommitMarkRequest(queue_uri=uri, app_id="other", record=True, version=1)
        )
        prefix = QueueKeys(uri).prefix
        keys = [k.decode() async for k in client.redis.scan_iter(match=prefix + "*")]
        keys.append(budget_key(ANONYMOUS_TOKEN))
        for key in keys:
            ttl = await client.redis.pttl(key)
            if key == prefix + "marks":
                assert ttl == -1, "commit marks are kept forever"
            else:
                assert 0 < ttl <= 2 * RETENTION * 1000, (key, ttl)
        assert uri.encode() in await client.redis.smembers(STAGED_QUEUES)
        clock.ms += round(RETENTION * 1000)
        assert await a.sweep() == 10
        assert a.expired_rows == 10
        assert uri.encode() not in await client.redis.smembers(STAGED_QUEUES)
        left = [k.decode() async for k in client.redis.scan_iter(match=prefix + "st[:ud]*")]
        assert left == [], left
        stats = await client.redis.hgetall(QueueKeys(uri).stats)
        assert stats[b"staged-expired"] == b"10"

    run(redis_url, test)


def test_with_too_few_replicas_a_stage_fails_and_a_commit_is_unknown(redis_url: str) -> None:
    """``--redis-min-replicas 1`` on a Redis without replicas: nothing is reported done."""

    async def main() -> None:
        spec = parse_redis_spec(redis_url)
        client = RedisClient(spec, retry_window=5.0, min_replicas=1, replica_timeout=0.05)
        registry = RedisRegistry(client, "node-r", Clock())
        staging = RedisStaging(client, registry, StagingLimits(retention=RETENTION), 600_000)
        uri, app = f"hf://staging/replicas-{uuid.uuid4().hex[:8]}", "app"
        try:
            with pytest.raises(StoreError, match="fewer than 1 replicas confirmed"):
                await staging.stage(AttemptKey(uri, app, 0, 0, 0), puts("w", 3), ANONYMOUS_TOKEN)
            reply = await staging.commit(uri, app, 0, {(0, 0): 3}, b"d", 3)
            assert reply.status == pb.STATUS_UNKNOWN, reply
            assert "a failover may lose it" in reply.message
        finally:
            await client.close()

    asyncio.run(main())


def test_a_call_made_while_a_long_script_holds_redis_waits_for_it(redis_url: str) -> None:
    """A big staged commit is one long script: other calls meanwhile get BUSY from Redis,
    and are retried until it is done rather than failed."""

    async def main() -> None:
        client = RedisClient(parse_redis_spec(redis_url), retry_window=10.0)
        spec = client.spec.nodes[0]
        blocker = redis_sync.Redis(host=spec[0], port=spec[1])
        await client.redis.config_set("busy-reply-threshold", 50)
        long_script = (
            "local t = redis.call('TIME') local until_us = t[1] * 1e6 + t[2] + 1e6 "
            "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= until_us return 1"
        )
        try:
            holding = asyncio.get_running_loop().run_in_executor(None, blocker.eval, long_script, 0)
            await asyncio.sleep(0.2)  # the script runs: Redis answers others BUSY
            await client.call("SET", lambda: client.redis.set("hf:busy-test", 1, px=60_000))
            assert await holding == 1
            assert await client.redis.get("hf:busy-test") == b"1"
        finally:
            await client.redis.config_set("busy-reply-threshold", 5000)
            blocker.close()
            await client.close()

    asyncio.run(main())


def test_a_commit_moves_the_write_sequence_the_node_checks(redis_url: str) -> None:
    async def test(nodes: Nodes) -> None:
        client, a, _, _ = nodes
        uri, app = f"hf://staging/seq-{uuid.uuid4().hex[:8]}", "app"
        # Left by a delete, expiring (``admin_scripts.DELETE``): the commit goes on from
        # it and keeps it, or the node would read 0 once it expired and report a loss.
        await client.redis.set(QueueKeys(uri).seq, 4, ex=60)
        await a.stage(AttemptKey(uri, app, 1, 0, 1), puts("s", 5), ANONYMOUS_TOKEN)
        reply = await a.commit(uri, app, 1, {(0, 1): 5}, b"digest", 5)
        assert reply.published == 5
        assert await client.redis.get(QueueKeys(uri).seq) == b"5"
        assert await client.redis.ttl(QueueKeys(uri).seq) == -1
        # Redis going back past the commit is what the node's loss check sees.
        assert a.registry.seqs.went_back(uri, 0, a.registry.seqs.highest(uri)) is not None

    run(redis_url, test)


def test_the_usage_counts_follow_what_is_staged_and_leave_no_field_behind(
    redis_url: str,
) -> None:
    """The per-(queue, application) rows and bytes the limits read (``stusage``): three
    versions of one row each, of 2, 1 and 0 bytes; each abort takes exactly its
    version's row and bytes off (a bytes count that reaches 0 goes while rows remain),
    the commit of the last leaves no field of the application behind, and nothing of
    the versions is left in the index or the sweep's schedule."""

    async def test(nodes: Nodes) -> None:
        client, a, _, _ = nodes
        uri, app = f"hf://staging/usage-{uuid.uuid4().hex[:8]}", "app"
        prefix = QueueKeys(uri).prefix

        async def counts() -> dict[str, int | str]:
            fields = await client.redis.hgetall(prefix + "stusage")
            return {
                key.decode()[:2]: value.decode() if key.startswith(b"a:") else int(value)
                for key, value in fields.items()
            }

        for version, payload in ((1, b"xy"), (2, b"z"), (3, b"")):
            row = [StagedRow(uuid.uuid4().bytes, payload, {})]
            key = AttemptKey(uri, app, version, 0, 1)
            assert await a.stage(key, row, ANONYMOUS_TOKEN) is StageOutcome.STAGED
        assert await counts() == {"r:": 3, "b:": 3, "a:": app}
        assert await a.abort(uri, app, 1) == 1
        assert await counts() == {"r:": 2, "b:": 1, "a:": app}
        assert await a.abort(uri, app, 2) == 1
        assert await counts() == {"r:": 1, "a:": app}  # 0 bytes: the field goes
        reply = await a.commit(uri, app, 3, {(0, 1): 1}, b"d", 1)
        assert (reply.status, reply.published) == (pb.STATUS_OK, 1)
        assert await counts() == {}
        assert await client.redis.zcard(prefix + "stdue") == 0
        left = [k.decode() async for k in client.redis.scan_iter(match=prefix + "st:*")]
        assert left == [], left

    run(redis_url, test)


def test_rows_without_bytes_are_staged_again_and_expire_without_a_script_error(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Counts that reach 0 are taken off without ``HINCRBY`` by -0 (Redis refuses what
    Lua makes of -0): a stage call repeated with empty payloads gives its token budget
    back 1 row and 0 bytes, and the sweep expires an attempt of empty rows and passes an
    attempt whose key Redis already expired (0 rows left) instead of failing on it."""

    async def test(nodes: Nodes) -> None:
        client, a, _, clock = nodes
        uri, app = f"hf://staging/zero-{uuid.uuid4().hex[:8]}", "app"
        empty = [StagedRow(uuid.uuid4().bytes, b"", {})]
        for _ in range(2):  # the second call adds nothing and gives its budget back
            assert await a.stage(AttemptKey(uri, app, 0, 0, 0), empty, ANONYMOUS_TOKEN) is (
                StageOutcome.STAGED
            )
        budget = await client.redis.hgetall(budget_key(ANONYMOUS_TOKEN))
        assert int(budget.get(b"rows", 0)) >= 1 and int(budget.get(b"bytes", 0)) >= 0
        one_byte = [StagedRow(uuid.uuid4().bytes, b"z", {})]
        await a.stage(AttemptKey(uri, app, 0, 1, 0), one_byte, ANONYMOUS_TOKEN)
        prefix = QueueKeys(uri).prefix
        gone = [k async for k in client.redis.scan_iter(match=prefix + "st:*:0:1:0")]
        assert len(gone) == 1
        await client.redis.delete(*gone)  # as if its own TTL had run out first
        clock.ms += round(RETENTION * 500)
        keeper = [StagedRow(uuid.uuid4().bytes, b"k", {})]  # staged later: not yet due
        await a.stage(AttemptKey(uri, app, 1, 0, 0), keeper, ANONYMOUS_TOKEN)
        clock.ms += round(RETENTION * 500)
        with caplog.at_level(logging.WARNING, "holdfast.broker.redis.staging"):
            assert await a.sweep() == 1  # the empty row; the vanished attempt had none
        assert "1 rows of " + uri + " application 'app' version 0" in caplog.text
        assert await client.redis.zcard(prefix + "stdue") == 1  # the keeper's
        stats = await client.redis.hgetall(QueueKeys(uri).stats)
        assert stats[b"staged-expired"] == b"1"
        # The empty row's count came off, and the vanished attempt's byte; its row
        # cannot be (the version index keeps an attempt's bytes and token, not its
        # rows): it stays counted until the usage hash's own TTL, as long as the
        # version's other keys. The keeper's row and byte stay.
        usage = await client.redis.hgetall(prefix + "stusage")
        assert sorted((k.decode()[:2], v) for k, v in usage.items()) == [
            ("a:", b"app"),
            ("b:", b"1"),
            ("r:", b"2"),
        ]

    run(redis_url, test)


def test_the_limits_of_a_queue_and_application_hold_to_the_row_and_byte(
    redis_url: str,
) -> None:
    """STAGE_ROWS's own check (the per-token budget is another): staging up to the
    rows and bytes an application may hold on a queue passes, one row or one byte more
    is refused whole, and another application has limits of its own."""

    async def test(nodes: Nodes) -> None:
        _, a, _, _ = nodes
        a.limits = StagingLimits(max_rows=4, max_bytes=8, retention=RETENTION)
        uri, app = f"hf://staging/app-limits-{uuid.uuid4().hex[:8]}", "app"

        def rows(tag: str, count: int, size: int) -> list[StagedRow]:
            return [StagedRow(uuid.uuid4().bytes, tag.encode() * size, {}) for _ in range(count)]

        staged = StageOutcome.STAGED
        assert await a.stage(AttemptKey(uri, app, 0, 0, 0), rows("a", 4, 2), "t") is staged
        over = StageOutcome.OVER_LIMIT
        assert await a.stage(AttemptKey(uri, app, 0, 1, 0), rows("b", 1, 0), "t") is over
        assert await a.stage(AttemptKey(uri, "other", 0, 0, 0), rows("c", 4, 2), "t") is staged
        assert await a.abort(uri, app, 0) == 4
        assert await a.stage(AttemptKey(uri, app, 1, 0, 0), rows("d", 1, 9), "t") is over
        assert await a.stage(AttemptKey(uri, app, 1, 0, 0), rows("d", 1, 8), "t") is staged

    run(redis_url, test)


def test_a_commit_past_the_queues_depth_limits_is_refused_whole(redis_url: str) -> None:
    """COMMIT_STAGED's check of the queue's ``max_messages`` and ``max_bytes``: a commit
    that fills a queue to its limit publishes, one that would pass it (by messages, or
    by bytes alone) publishes nothing."""

    async def test(nodes: Nodes) -> None:
        _, a, _, _ = nodes
        tag = uuid.uuid4().hex[:8]
        by_count, by_bytes = f"hf://staging/full-n-{tag}", f"hf://staging/full-b-{tag}"
        await a.registry.policies.set(by_count, QueuePolicy(max_messages=1))
        await a.registry.policies.set(by_bytes, QueuePolicy(max_bytes=1))
        for uri in (by_count, by_bytes):
            for version, outcome in ((0, pb.STATUS_OK), (1, pb.STATUS_QUEUE_FULL)):
                row = [StagedRow(uuid.uuid4().bytes, b"x" if "-b-" in uri else b"", {})]
                await a.stage(AttemptKey(uri, "app", version, 0, 0), row, ANONYMOUS_TOKEN)
                reply = await a.commit(uri, "app", version, {(0, 0): 1}, b"d", 1)
                assert reply.status == outcome, (uri, version, reply)
                assert reply.published == (1 if outcome == pb.STATUS_OK else 0)

    run(redis_url, test)


def test_a_commit_counts_places_and_schedules_what_it_publishes(redis_url: str) -> None:
    """What COMMIT_STAGED writes besides the messages: the queue's bytes, its accepted
    and staged-discarded counters (an abort's too), and the pickup deadline of each row
    staged with ``x-pickup-ttl-ms`` (none for a row without); one row discarded each
    time, so a count of 1 is a count."""

    async def test(nodes: Nodes) -> None:
        client, a, _, clock = nodes
        uri = f"hf://staging/effects-{uuid.uuid4().hex[:8]}"
        queue = QueueKeys(uri)
        kept = [
            StagedRow(uuid.uuid4().bytes, b"abc", {PICKUP_TTL: "5000", "k": "v"}),
            StagedRow(uuid.uuid4().bytes, b"d", {PICKUP_TTL: "1"}),
            StagedRow(uuid.uuid4().bytes, b"ef", {}),
        ]
        await a.stage(AttemptKey(uri, "app", 0, 0, 1), kept, ANONYMOUS_TOKEN)
        await a.stage(AttemptKey(uri, "app", 0, 0, 2), puts("copy", 1), ANONYMOUS_TOKEN)
        reply = await a.commit(uri, "app", 0, {(0, 1): 3}, b"d", 3)
        assert (reply.published, reply.discarded) == (3, 1)
        assert await client.redis.get(queue.bytes) == b"6"
        stats = await client.redis.hgetall(queue.stats)
        assert (stats[b"accepted"], stats[b"staged-discarded"]) == (b"3", b"1")
        deadlines = [await client.redis.zscore(queue.pickup, row.guid) for row in kept]
        assert deadlines == [clock.ms + 5000, clock.ms + 1, None]
        await a.stage(AttemptKey(uri, "app", 1, 0, 0), puts("gone", 1), ANONYMOUS_TOKEN)
        assert await a.abort(uri, "app", 1) == 1
        stats = await client.redis.hgetall(queue.stats)
        assert stats[b"staged-discarded"] == b"2"

    run(redis_url, test)


def test_a_staged_guid_the_queue_holds_with_other_content_refuses_the_commit(
    redis_url: str,
) -> None:
    """COMMIT_STAGED compares each staged row's content digest with the message its
    GUID already names: the same content is a replay (nothing published again), other
    content refuses the commit (CONFLICT, counted), and one GUID staged by two named
    partitions refuses it too, however few."""

    async def test(nodes: Nodes) -> None:
        client, a, _, _ = nodes
        uri = f"hf://staging/conflict-{uuid.uuid4().hex[:8]}"
        guid = uuid.uuid4().bytes
        first = [StagedRow(guid, b"original", {})]
        await a.stage(AttemptKey(uri, "first", 0, 0, 0), first, ANONYMOUS_TOKEN)
        assert (await a.commit(uri, "first", 0, {(0, 0): 1}, b"d", 1)).published == 1
        await a.stage(AttemptKey(uri, "replay", 0, 0, 0), first, ANONYMOUS_TOKEN)
        replay = await a.commit(uri, "replay", 0, {(0, 0): 1}, b"d", 1)
        assert replay.status == pb.STATUS_OK  # published as a PUT would be: deduplicated
        assert await client.redis.llen(QueueKeys(uri).ready) == 1
        changed = [StagedRow(guid, b"changed", {})]
        await a.stage(AttemptKey(uri, "changed", 0, 0, 0), changed, ANONYMOUS_TOKEN)
        conflict = await a.commit(uri, "changed", 0, {(0, 0): 1}, b"d", 1)
        assert (conflict.status, conflict.published) == (pb.STATUS_CONFLICT, 0)
        assert "1" in conflict.message, conflict.message
        twice = StagedRow(uuid.uuid4().bytes, b"twice", {})
        for partition in (0, 1):
            key = AttemptKey(uri, "repeated", 0, partition, 0)
            await a.stage(key, [twice], ANONYMOUS_TOKEN)
        repeated = await a.commit(uri, "repeated", 0, {(0, 0): 1, (1, 0): 1}, b"d", 2)
        assert (repeated.status, repeated.published) == (pb.STATUS_CONFLICT, 0)

    run(redis_url, test)


def test_a_token_budget_given_back_past_what_it_holds_stays_at_zero(redis_url: str) -> None:
    """GIVE_BUDGET never leaves a count below 0 (a stage that added more than it took is
    given back as a negative take): past both counts the key goes; past one, that one
    is 0 and the other keeps its value."""

    async def test(nodes: Nodes) -> None:
        client, a, _, _ = nodes
        token = f"budget-{uuid.uuid4().hex[:8]}"
        key = budget_key(token)
        await a.budgets.give(token, -3, -10)  # take 3 rows and 10 bytes
        assert await client.redis.hgetall(key) == {b"rows": b"3", b"bytes": b"10"}
        await a.budgets.give(token, 5, 1)
        assert await client.redis.hgetall(key) == {b"rows": b"0", b"bytes": b"9"}
        await a.budgets.give(token, 0, 8)
        assert await client.redis.hgetall(key) == {b"rows": b"0", b"bytes": b"1"}
        await a.budgets.give(token, 0, 1)
        assert await client.redis.exists(key) == 0
        await a.budgets.give(token, 0, -9)
        await a.budgets.give(token, -1, 0)
        await a.budgets.give(token, 0, 20)
        assert await client.redis.hgetall(key) == {b"rows": b"1", b"bytes": b"0"}
        await a.budgets.give(token, 1, 0)
        assert await client.redis.exists(key) == 0

    run(redis_url, test)


def test_a_commit_mark_moves_only_forward_and_keeps_its_content(redis_url: str) -> None:
    """RECORD_MARK: a higher version replaces the mark; the same version again with
    other content is refused (CONFLICT) and leaves it; a lower one leaves it."""

    async def test(nodes: Nodes) -> None:
        client, _, _, clock = nodes
        marks = RedisMarks(client, clock)
        uri, app = f"hf://staging/marks-{uuid.uuid4().hex[:8]}", "app"

        async def record(version: int, digest: bytes) -> pb.CommitMarkReply:
            reply: pb.CommitMarkReply = await marks.handle(
                pb.CommitMarkRequest(
                    queue_uri=uri, app_id=app, record=True, version=version, digest=digest
                )
            )
            return reply

        assert (await record(1, b"a")).status == pb.STATUS_OK
        changed = await record(1, b"b")
        assert changed.status == pb.STATUS_CONFLICT
        assert (changed.mark.version, changed.mark.digest) == (1, b"a")
        older = await record(0, b"c")
        assert (older.mark.version, older.mark.digest) == (1, b"a")
        newer = await record(2, b"d")
        assert (newer.status, newer.mark.version, newer.mark.digest) == (pb.STATUS_OK, 2, b"d")

    run(redis_url, test)


def test_a_commit_of_thousands_of_rows_queues_every_one_in_order(redis_url: str) -> None:
    """COMMIT_STAGED pushes the published GUIDs onto the ready list a thousand at a
    time: 2,500 rows staged in one attempt are all ready after the commit, each once."""

    async def test(nodes: Nodes) -> None:
        client, a, _, _ = nodes
        uri = f"hf://staging/many-{uuid.uuid4().hex[:8]}"
        rows = puts("many", 2_500)
        await a.stage(AttemptKey(uri, "app", 0, 0, 0), rows, ANONYMOUS_TOKEN)
        assert (await a.commit(uri, "app", 0, {(0, 0): 2_500}, b"d", 2_500)).published == 2_500
        ready = await client.redis.lrange(QueueKeys(uri).ready, 0, -1)
        assert sorted(ready) == sorted(row.guid for row in rows)  # each once, none lost

    run(redis_url, test)
