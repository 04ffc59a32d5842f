"""Bounds of transactional writes on every store, directly and through the proxy: a
token's staged rows and bytes are capped over every queue and application, and a stage
call past a cap is refused whole (``LimitExceededError``) when it is made, staging
nothing of it; an attempt belongs to the token that staged it (``PermissionDeniedError``
for another); what a commit or an abort takes out of staging is given back. Staged rows
left uncommitted past the retention are discarded by the broker's sweep, logged at
WARNING and counted, and a commit of them then fails loudly.

Through the proxy the broker sees the proxy's upstream token, so every client of that
proxy shares one budget; the tests pin that too."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator

import pytest

from holdfast.broker.server import Broker
from holdfast.broker.staging import StagingLimits
from holdfast.proto.staged_rows import StagedPut
from holdfast.sdk.errors import LimitExceededError, PermissionDeniedError, RequestFailedError
from holdfast.sdk.options import SessionOptions
from holdfast.sdk.staging import Version, abort, commit, stage
from holdfast.server.security import ServerSecurity
from tests.conformance.conftest import PATHS, STORES, store_spec
from tests.conformance.harness import World, open_world
from tests.conformance.support import peek
from tests.conformance.test_staging import rows
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.timeout(90)]

LIMITS = StagingLimits(max_rows_per_token=100, max_bytes_per_token=64_000, retention=60.0)
"""Small per-token caps, and staged rows that expire after a minute of broker time."""


@pytest.fixture(
    scope="module",
    params=[(s, p) for s in STORES for p in PATHS],
    ids=[f"{s}-{p}" for s in STORES for p in PATHS],
)
def limited(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, list[str]]]:
    """A broker with ``LIMITS`` that checks tokens (two writers of their own: their
    budgets are fresh on a Redis shared by other tests), and the writers' tokens."""
    kind, path = request.param
    directory = tmp_path_factory.mktemp(f"staging-limits-{kind}-{path}")
    tag = uuid.uuid4().hex[:8]
    writers = [f"writer-{n}-{tag}" for n in ("a", "b")]
    tokens = [
        {"token": t, "name": t, "read": ["*"], "write": ["*"], "admin": False} for t in writers
    ]
    tokens.append(
        {"token": "ops-token", "name": f"proxy-{tag}", "read": ["*"], "write": ["*"], "admin": True}
    )
    auth = directory / "auth.json"
    auth.write_text(json.dumps({"tokens": tokens}))
    token_file = directory / "upstream-token"
    token_file.write_text("ops-token")
    with open_world(
        kind,
        store_spec(kind, request, directory),
        path,
        directory,
        proxy_args=["--auth-file", str(auth), "--upstream-token-file", str(token_file)],
        admin_token="ops-token",
        security=ServerSecurity(auth_file=str(auth)),
        staging=LIMITS,
    ) as world:
        yield world, writers


def target(world: World, token: str, uri: str, app: str, version: int = 0) -> Version:
    return Version(
        [world.address], uri, app, version, timeout=15.0, options=SessionOptions(token=token)
    )


def test_a_token_past_its_staged_rows_is_refused_at_the_stage_call(
    limited: tuple[World, list[str]],
) -> None:
    world, (writer, other) = limited
    first, second = world.uri("first"), world.uri("second")
    a = target(world, writer, first, "app-a")
    assert stage(a, 0, 0, rows("a", 60))
    b = target(world, writer, second, "app-b")  # another queue and application
    with pytest.raises(LimitExceededError, match="staging limits of token"):
        stage(b, 0, 0, rows("b", 50))
    with pytest.raises(RequestFailedError, match="0 rows staged, the writer reported 50"):
        commit(b, {(0, 0): 50}, b"d", 50)  # nothing of the refused call was staged
    assert stage(b, 0, 0, rows("b", 40))  # what is left of the budget
    with pytest.raises(LimitExceededError):
        stage(b, 1, 0, rows("c", 1))
    assert stage(b, 0, 0, rows("b", 40))  # a retried call adds nothing, so it passes
    someone_else = target(world, other, second, "app-c")
    if world.path == "direct":
        assert stage(someone_else, 0, 0, rows("o", 100))  # a budget of its own
        assert abort(someone_else) == 100
        intruder = target(world, other, second, "app-b")
        with pytest.raises(PermissionDeniedError, match="staged by another token"):
            stage(intruder, 0, 0, rows("x", 1))  # an attempt belongs to its token
    else:
        with pytest.raises(LimitExceededError):  # the proxy's token, shared
            stage(someone_else, 0, 0, rows("o", 1))
    # A commit and an abort give their rows back.
    assert commit(a, {(0, 0): 60}, b"d", 60).published == 60
    assert abort(b) == 40
    later = target(world, writer, second, "app-b", 1)
    assert stage(later, 0, 0, rows("later", 100))
    assert abort(later) == 100
    assert len(peek(world, first)) == 60 and peek(world, second) == []


def test_a_token_past_its_staged_bytes_is_refused_at_the_stage_call(
    limited: tuple[World, list[str]],
) -> None:
    world, (writer, _) = limited
    uri = world.uri("bytes")
    version = target(world, writer, uri, "app-bytes")
    big: list[StagedPut] = [(uuid.uuid4().bytes, b"x" * 40_000, {})]
    assert stage(version, 0, 0, big)
    with pytest.raises(LimitExceededError, match="64000 bytes"):
        stage(version, 1, 0, [(uuid.uuid4().bytes, b"y" * 30_000, {})])
    assert stage(version, 1, 0, [(uuid.uuid4().bytes, b"y" * 20_000, {})])
    assert stage(version, 2, 0, [(uuid.uuid4().bytes, b"w" * 4_000, {})])  # exactly 64000
    with pytest.raises(LimitExceededError, match="64000 bytes"):
        stage(version, 3, 0, [(uuid.uuid4().bytes, b"v", {})])  # one byte past
    assert abort(version) == 3
    assert stage(version, 1, 1, [(uuid.uuid4().bytes, b"z" * 60_000, {})])
    assert abort(version) == 1


def expired_rows(broker: Broker) -> int:
    redis = broker.redis
    return broker.staging.book.expired_rows if redis is None else redis.staging.expired_rows


def test_rows_left_staged_past_the_retention_expire_logged_and_counted(
    limited: tuple[World, list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    world, (writer, _) = limited
    uri = world.uri("expiring")
    version = target(world, writer, uri, "app-expiring")
    assert stage(version, 0, 0, rows("e", 7))
    before = world.broker.call(expired_rows)
    world.time.advance(LIMITS.retention - 1)
    with caplog.at_level(logging.WARNING):
        world.time.advance(2)
        wait_until(
            lambda: world.broker.call(expired_rows) >= before + 7, 10.0, "the staged rows expire"
        )
    assert any(
        "staged rows expired: 7 rows of " + uri in record.getMessage() for record in caplog.records
    )
    with pytest.raises(RequestFailedError, match="0 rows staged, the writer reported 7"):
        commit(version, {(0, 0): 7}, b"d", 7)
    assert peek(world, uri) == []
    # Their budget came back: the token stages its whole budget again.
    again = target(world, writer, uri, "app-expiring", 1)
    assert stage(again, 0, 0, rows("f", 100))
    assert abort(again) == 100
