"""``fetch_reply`` from a session the server refuses (no token, or one it does not
know), on a broker with ``--auth-file`` and through a proxy with one: the server's
``AuthenticationError``, as every other call reports it, not ``UnknownRequestError``
(the id fails its check under a missing or wrong token too). An id of another valid
token stays ``UnknownRequestError``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from holdfast.sdk import (
    AuthenticationError,
    HoldfastError,
    Session,
    SessionOptions,
    UnknownRequestError,
    aio,
)
from tests.security.conftest import token
from tests.support.processes import BrokerProcess, ProxyProcess
from tests.support.sessions import FAST

pytestmark = pytest.mark.timeout(60)

REFUSED = {None: "a token is required", "wrong-token-0001": "the token is not valid"}
"""A session's token the servers refuse, and what the refusal says."""


def options(token_text: str | None) -> SessionOptions:
    return SessionOptions(reconnect=FAST.reconnect, token=token_text)


def assert_refused(error: BaseException, said: str) -> None:
    """``error`` is the server's refusal of the session: ``AuthenticationError``, or,
    when the session had failed before the call asked, the ``SessionClosedError`` every
    call on a failed session raises, caused by it."""
    refusal = error if isinstance(error, AuthenticationError) else error.__cause__
    assert isinstance(refusal, AuthenticationError), repr(error)
    assert said in str(error)


@pytest.fixture
def addresses(auth_file: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A broker with ``--auth-file`` and a proxy in front of it with one too."""
    upstream_token = tmp_path / "proxy.token"
    upstream_token.write_text(token("proxy") + "\n")
    with BrokerProcess(["--auth-file", str(auth_file)]) as broker:
        upstream = ["--upstream", broker.address, "--upstream-token-file", str(upstream_token)]
        with ProxyProcess([*upstream, "--auth-file", str(auth_file)]) as proxy:
            yield {"broker": broker.address, "proxy": proxy.address}


def writers_request_id(address: str) -> str:
    with Session(address, options=options(token("writer"))) as session:
        return session.request_durable("hf://orders/fetch-tokens", b"go", timeout=10)


@pytest.mark.parametrize("via", ["broker", "proxy"])
def test_a_refused_session_s_fetch_reply_is_an_authentication_error(
    addresses: dict[str, str], via: str
) -> None:
    address = addresses[via]
    request_id = writers_request_id(address)
    for token_text, said in REFUSED.items():
        with Session(address, options=options(token_text)) as session:
            with pytest.raises(HoldfastError) as raised:
                session.fetch_reply(request_id, timeout=10)
            assert_refused(raised.value, said)

    async def on_asyncio(token_text: str | None) -> BaseException:
        async with aio.Session(address, options=options(token_text)) as session:
            with pytest.raises(HoldfastError) as raised:
                await session.fetch_reply(request_id, timeout=10)
        return raised.value

    for token_text, said in REFUSED.items():
        assert_refused(asyncio.run(on_asyncio(token_text)), said)


@pytest.mark.parametrize("via", ["broker", "proxy"])
def test_an_id_of_another_valid_token_is_still_unknown(addresses: dict[str, str], via: str) -> None:
    address = addresses[via]
    request_id = writers_request_id(address)
    with (
        Session(address, options=options(token("billing"))) as session,
        pytest.raises(UnknownRequestError, match="not issued to a session of this token"),
    ):
        session.fetch_reply(request_id, timeout=10)
