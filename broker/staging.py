"""Staged rows of transactional writers: the broker's side of the Spark connector's commit.

A transactional writer (Spark's ``format("holdfast")``, after Kafka transactions and
Delta's commit protocol) stages each task attempt's rows under ``AttemptKey``
(queue, application id, version, partition, attempt). Staged rows are invisible: no
consumer gets them, a purge leaves them. The writer's driver then either

* **commits** version V naming the attempts Spark reported committed (one per
  partition, with its row count): those rows are published, every other attempt of V
  (retries, speculative copies, orphans of a killed driver) is discarded, and V is
  recorded as committed, after which a stage or a commit of V (or below) changes
  nothing however late it comes; or
* **aborts** V: every attempt of V is discarded.

A commit is decided before anything is published: a named attempt whose staged count
differs from the writer's (its rows expired, or the broker lost them) refuses the
commit (``MISSING``), and a GUID staged by two named attempts (a key column value
repeated across partitions) refuses it (``REPEATED_KEYS``), so a refused commit
publishes nothing. Each row's moves are the lifecycle table's (``lifecycle``: STAGED ->
READY on commit, -> DISCARDED on discard or past its deadline); rows of one attempt
always move together, so the book applies the table per attempt.

Bounds: ``StagingLimits`` caps the rows and bytes staged per (queue, application)
and per token (the name of the writer's token: every call without an auth file is
``anonymous``), refused at the stage call that would pass a cap (an attempt belongs to
the token that staged it first: another token's stage into it is refused), and the
time a row may stay staged (``retention``, default 7 days: far beyond any dedup
window); an expiry is logged at WARNING and counted (``expired_rows``), never silent.

This module is the decision logic, with state in memory and, given a ``Journal``
(``staging_file`` for a sqlite store), every change written through to disk;
``staging_service`` serves it on the wire.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from holdfast.broker.lifecycle import Effect, Event, Message, Rules, State, apply

log = logging.getLogger(__name__)

DEFAULT_STAGE_RETENTION = 7 * 24 * 3600.0
"""Seconds a staged row may wait for its commit before it is discarded (7 days)."""

MAX_STAGE_RETENTION = 365 * 24 * 3600.0
"""The longest retention (a year): a commit a year late is no commit. Bounded so the
deadline stays a finite number of milliseconds (the Redis store keeps it, and a TTL
of twice it, in integer ms: an infinite one raised OverflowError there)."""

ANONYMOUS_TOKEN = "anonymous"
"""The token name of calls on a broker without an auth file."""


@dataclass(frozen=True, slots=True)
class StagingLimits:
    """Per (queue, application) and per token: most rows and payload bytes staged at
    once; and the seconds a row may stay staged."""

    max_rows: int = 10_000_000
    max_bytes: int = 4 << 30
    retention: float = DEFAULT_STAGE_RETENTION
    max_rows_per_token: int = 20_000_000
    """Rows one token may have staged at once, over every queue and application."""
    max_bytes_per_token: int = 8 << 30
    """Payload bytes one token may have staged at once."""

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes", "max_rows_per_token", "max_bytes_per_token"):
            if getattr(self, name) < 1:
                raise ValueError(f"staging limit {name} must be >= 1")
        if not 0 < self.retention <= MAX_STAGE_RETENTION:  # NaN too
            raise ValueError(
                f"the staging retention must be > 0 and at most {MAX_STAGE_RETENTION:.0f} seconds"
            )


@dataclass(frozen=True, slots=True)
class AttemptKey:
    """Where a task attempt's rows are staged."""

    queue_uri: str
    app_id: str
    version: int
    partition: int
    attempt: int


@dataclass(frozen=True, slots=True)
class StagedRow:
    """One staged message."""

    guid: bytes
    payload: bytes
    properties: Mapping[str, str]


class StageOutcome(Enum):
    """What a stage call got."""

    STAGED = "staged"
    COMMITTED = "committed"
    """The version is committed already: nothing staged; the task has nothing to do."""
    OVER_LIMIT = "over-limit"
    """Over ``StagingLimits`` of the (queue, application): nothing of this call staged."""
    OVER_TOKEN_LIMIT = "over-token-limit"
    """Over ``StagingLimits`` of the token: nothing of this call staged."""
    OTHER_TOKEN = "other-token"
    """The attempt was staged by another token (its rows count against that one's
    budget): nothing of this call staged."""


class CommitOutcome(Enum):
    """What a commit got."""

    PUBLISHED = "published"
    ALREADY = "already"
    """The version was committed before: nothing changes (a late replay)."""
    MISSING = "missing"
    """A named attempt's staged rows are not all there: nothing published."""
    REPEATED_KEYS = "repeated-keys"
    """A GUID was staged by two named attempts: nothing published."""


@dataclass(slots=True)
class _Attempt:
    rows: dict[bytes, StagedRow] = field(default_factory=dict)
    """By GUID: staging a GUID again (a retried call) replaces it."""
    bytes: int = 0
    deadline: float = 0.0
    state: State = State.STAGED
    token: str = ANONYMOUS_TOKEN
    """The token that staged the attempt: its rows count against that token's budget."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    """A commit's outcome; ``rows`` to publish (PUBLISHED only), ``problem`` in words."""

    outcome: CommitOutcome
    rows: Sequence[StagedRow] = ()
    discarded: int = 0
    problem: str = ""


class Journal(Protocol):
    """Where a book writes its changes through to (``staging_file.StagingFile``)."""

    def added(
        self, key: AttemptKey, rows: Iterable[StagedRow], deadline: float, token: str
    ) -> None:
        """``rows`` were staged under ``key`` by ``token``; ``key`` now ends at
        ``deadline``."""
        ...

    def removed(self, key: AttemptKey) -> None:
        """``key``'s rows left the book."""
        ...


class StagingBook:
    """Staged attempts and committed versions (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], limits: StagingLimits | None = None) -> None:
        self._clock = clock
        self.journal: Journal | None = None
        """Set by ``restore``: every change is written through to it."""
        self.limits = limits or StagingLimits()
        self._attempts: dict[AttemptKey, _Attempt] = {}
        self._committed: dict[tuple[str, str], int] = {}
        self._usage: dict[tuple[str, str], tuple[int, int]] = {}
        self._token_usage: dict[str, tuple[int, int]] = {}
        self.expired_rows = 0
        """Staged rows discarded at their deadline (logged too)."""
        self.discarded_rows = 0
        """Staged rows discarded by a commit of another attempt or an abort."""

    def restore(
        self, journal: Journal, rows: Iterable[tuple[AttemptKey, StagedRow, float, str]]
    ) -> int:
        """Take back what ``journal`` kept (``rows`` of each attempt with its deadline
        and token), and write every later change through to it; returns the rows
        restored."""
        count = 0
        for key, row, deadline, token in rows:
            attempt = self._attempts.get(key)
            if attempt is None:
                attempt = self._attempts[key] = _Attempt(token=token)
            attempt.rows[row.guid] = row
            attempt.bytes += len(row.payload)
            attempt.deadline = deadline
            app = (key.queue_uri, key.app_id)
            self._count(app, attempt.token, 1, len(row.payload))
            count += 1
        self.journal = journal
        return count

    @property
    def staged_total(self) -> int:
        """Rows staged now, all attempts together."""
        return sum(rows for rows, _ in list(self._usage.values()))

    def committed_version(self, queue_uri: str, app_id: str) -> int | None:
        """The latest version committed through this book (None: none)."""
        return self._committed.get((queue_uri, app_id))

    def staged_rows(self, key: AttemptKey) -> int:
        """Rows staged under ``key`` (0: none)."""
        attempt = self._attempts.get(key)
        return 0 if attempt is None else len(attempt.rows)

    def mark_committed(self, queue_uri: str, app_id: str, version: int) -> None:
        """Record that ``version`` is committed (its commit mark says so)."""
        app = (queue_uri, app_id)
        self._committed[app] = max(version, self._committed.get(app, version))

    def _count(self, app: tuple[str, str], token: str, rows: int, size: int) -> None:
        """Add ``rows`` and ``size`` bytes (negative: take away) to the usage of ``app``
        and of ``token``."""
        used_rows, used_bytes = self._usage.get(app, (0, 0))
        self._usage[app] = (used_rows + rows, used_bytes + size)
        self._count_token(token, rows, size)

    def _count_token(self, token: str, rows: int, size: int) -> None:
        token_rows, token_bytes = self._token_usage.get(token, (0, 0))
        if token_rows + rows <= 0 and token_bytes + size <= 0:
            self._token_usage.pop(token, None)
        else:
            self._token_usage[token] = (token_rows + rows, token_bytes + size)

    def token_usage(self, token: str) -> tuple[int, int]:
        """Rows and payload bytes ``token`` has staged now."""
        return self._token_usage.get(token, (0, 0))

    def stage(
        self, key: AttemptKey, rows: Iterable[StagedRow], token: str = ANONYMOUS_TOKEN
    ) -> StageOutcome:
        """Add ``rows`` to attempt ``key`` for ``token`` (a task stages in several calls;
        a GUID staged again replaces its row, so a retried call adds nothing)."""
        app = (key.queue_uri, key.app_id)
        committed = self._committed.get(app)
        if committed is not None and key.version <= committed:
            return StageOutcome.COMMITTED
        attempt = self._attempts.get(key)
        if attempt is not None and attempt.token != token:
            return StageOutcome.OTHER_TOKEN
        have = attempt.rows if attempt is not None else {}
        batch = {row.guid: row for row in rows}
        new_rows = sum(1 for guid in batch if guid not in have)
        size = sum(len(row.payload) for row in batch.values())
        size -= sum(len(have[guid].payload) for guid in batch if guid in have)
        used_rows, used_bytes = self._usage.get(app, (0, 0))
        limits = self.limits
        if used_rows + new_rows > limits.max_rows or used_bytes + size > limits.max_bytes:
            return StageOutcome.OVER_LIMIT
        token_rows, token_bytes = self._token_usage.get(token, (0, 0))
        if (
            token_rows + new_rows > limits.max_rows_per_token
            or token_bytes + size > limits.max_bytes_per_token
        ):
            return StageOutcome.OVER_TOKEN_LIMIT
        if attempt is None:
            attempt = self._attempts[key] = _Attempt(token=token)
        deadline = self._clock() + limits.retention
        if self.journal is not None:
            self.journal.added(key, batch.values(), deadline, token)  # durable first
        attempt.rows.update(batch)
        attempt.bytes += size
        attempt.deadline = deadline
        self._count(app, token, new_rows, size)
        return StageOutcome.STAGED

    def _of_version(self, queue_uri: str, app_id: str, version: int) -> list[AttemptKey]:
        return [
            key
            for key in self._attempts
            if (key.queue_uri, key.app_id, key.version) == (queue_uri, app_id, version)
        ]

    def _move(self, key: AttemptKey, event: Event) -> _Attempt:
        """Apply ``event`` to attempt ``key`` through the lifecycle table; a row that
        leaves STAGED leaves the book."""
        attempt = self._attempts[key]
        message = Message(State.STAGED, stage_deadline=attempt.deadline)
        outcome = apply(message, event, self._clock(), Rules())
        attempt.state = outcome.message.state
        if attempt.state is not State.STAGED:
            if self.journal is not None:
                self.journal.removed(key)
            del self._attempts[key]
            app = (key.queue_uri, key.app_id)
            self._count(app, attempt.token, -len(attempt.rows), -attempt.bytes)
            if outcome.row.effect is Effect.DROP and event is not Event.TICK:
                self.discarded_rows += len(attempt.rows)
        return attempt

    def commit(
        self, queue_uri: str, app_id: str, version: int, attempts: Mapping[tuple[int, int], int]
    ) -> CommitResult:
        """Commit ``version`` in one step (``prepare`` and, if it may publish, ``finish``
        at once); see ``prepare``."""
        result = self.prepare(queue_uri, app_id, version, attempts)
        if result.outcome is not CommitOutcome.PUBLISHED:
            return result
        discarded = self.finish(queue_uri, app_id, version, attempts)
        return CommitResult(CommitOutcome.PUBLISHED, result.rows, discarded)

    def finish(
        self, queue_uri: str, app_id: str, version: int, attempts: Mapping[tuple[int, int], int]
    ) -> int:
        """The rows ``prepare`` gave are published: the named attempts leave the book
        (COMMIT), the others are discarded, the version is committed; returns the rows
        discarded."""
        discarded = 0
        for key in self._of_version(queue_uri, app_id, version):
            if (key.partition, key.attempt) in attempts:
                self._move(key, Event.COMMIT)
            else:
                discarded += len(self._move(key, Event.DISCARD).rows)
        self.mark_committed(queue_uri, app_id, version)
        return discarded

    def prepare(
        self, queue_uri: str, app_id: str, version: int, attempts: Mapping[tuple[int, int], int]
    ) -> CommitResult:
        """Decide a commit of ``version`` without changing anything but a committed
        version's leftovers: ``attempts`` maps each committed (partition, attempt) to the
        rows its task staged. PUBLISHED gives the rows to publish; once they are, call
        ``finish`` (if publishing fails, nothing moved: the commit can be tried again).
        ALREADY discards what was staged for a version committed before."""
        app = (queue_uri, app_id)
        committed = self._committed.get(app)
        staged = self._of_version(queue_uri, app_id, version)
        if committed is not None and version <= committed:
            discarded = sum(len(self._move(key, Event.DISCARD).rows) for key in staged)
            return CommitResult(CommitOutcome.ALREADY, discarded=discarded)
        chosen = {
            (partition, attempt): AttemptKey(queue_uri, app_id, version, partition, attempt)
            for partition, attempt in attempts
        }
        for (partition, attempt), rows in attempts.items():
            have = self.staged_rows(chosen[(partition, attempt)])
            if have != rows:
                return CommitResult(
                    CommitOutcome.MISSING,
                    problem=f"partition {partition} attempt {attempt}: {have} rows staged, "
                    f"the writer reported {rows} (expired, or lost by the broker)",
                )
        published: dict[bytes, StagedRow] = {}
        repeated = 0
        for key in chosen.values():
            found = self._attempts.get(key)
            for guid, row in found.rows.items() if found is not None else ():
                repeated += guid in published
                published[guid] = row
        if repeated:
            return CommitResult(
                CommitOutcome.REPEATED_KEYS,
                problem=f"{repeated} GUIDs were staged by more than one partition "
                "(a key column value repeated across partitions)",
            )
        return CommitResult(CommitOutcome.PUBLISHED, list(published.values()))

    def abort(self, queue_uri: str, app_id: str, version: int) -> int:
        """Discard every attempt of ``version``; returns the rows discarded."""
        staged = self._of_version(queue_uri, app_id, version)
        return sum(len(self._move(key, Event.DISCARD).rows) for key in staged)

    def sweep(self) -> int:
        """Discard the attempts past their deadline (logged, counted); returns rows."""
        expired = 0
        for key in list(self._attempts):
            attempt = self._move(key, Event.TICK)
            if attempt.state is State.DISCARDED:
                expired += len(attempt.rows)
                log.warning(
                    "staged rows expired: %d rows of %s application %r version %d partition "
                    "%d attempt %d were never committed within %g s and are discarded",
                    len(attempt.rows),
                    key.queue_uri,
                    key.app_id[:100],
                    key.version,
                    key.partition,
                    key.attempt,
                    self.limits.retention,
                )
        self.expired_rows += expired
        return expired
