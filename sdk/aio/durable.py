"""Durable requests on the asyncio ``Session``: ``await session.request_durable(...)``
and ``await session.fetch_reply(request_id, timeout)``, with the rules, the request
ids and the errors of ``holdfast.sdk.rpc.durable`` (an id from either API is
fetched by either)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from holdfast.sdk import tracing
from holdfast.sdk.aio import streams as streaming
from holdfast.sdk.errors import (
    HoldfastError,
    RequestTimeoutError,
    RpcError,
    UnknownRequestError,
)
from holdfast.sdk.instrument import Untraced
from holdfast.sdk.rpc import calls, durable
from holdfast.sdk.rpc.values import Reply
from holdfast.sdk.types import Ack, Message

if TYPE_CHECKING:
    from holdfast.sdk.aio.queue import Queue
    from holdfast.sdk.aio.rpc import AsyncCaller
    from holdfast.sdk.aio.session import Session


async def post_durable(
    caller: AsyncCaller,
    token: str | None,
    uri: str,
    payload: bytes,
    *,
    properties: Mapping[str, str] | None,
    key: str | None,
    keep: float,
    timeout: float,
) -> str:
    """Post a durable request and await the broker's ACK; its request id."""
    deadline = calls.deadlines(timeout, None)[0]
    try:  # within the call's timeout, also while the broker is unreachable
        target, domain = await caller.target(uri, key, calls.left(deadline))
    except RequestTimeoutError as error:
        raise calls.open_timed_out(uri, timeout, error) from None
    put = durable.prepare(domain, caller.next_guid(), properties, key, keep, timeout, token)
    acked: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()

    def on_ack(ack: Ack) -> None:
        if not acked.done():
            acked.set_result(ack)

    await target.post(payload, put.properties, on_ack, guid=put.rid.guid)
    try:
        ack: Ack | None = await asyncio.wait_for(acked, calls.left(deadline))
    except TimeoutError:
        ack = None
    return durable.check_ack(put, ack, timeout)


async def fetch(session: Session, token: str | None, request_id: str, timeout: float) -> Reply:
    """The reply of a durable request (``holdfast.sdk.rpc.durable``)."""
    try:
        rid = durable.start_fetch(request_id, token, timeout)
    except UnknownRequestError:
        try:  # is it the id, or this session the server refuses? (``durable.session_refused``)
            await session.has_workers(
                durable.probe_uri(request_id), timeout=durable.probe_timeout(timeout)
            )
        except HoldfastError as error:
            if durable.session_refused(error):
                raise
        raise
    deadline = durable.fetch_deadline(timeout)
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    try:  # within the fetch's timeout, also while the broker is unreachable
        queue = await session.open_queue(
            rid.reply_uri,
            read=True,
            write=True,
            on_message=Untraced(inbox.put_nowait),  # request/reply's own message: untraced
            options=durable.ONE_AT_A_TIME,
            timeout=calls.left(deadline),
        )
    except RequestTimeoutError as error:
        raise durable.not_fetched(rid, timeout, error) from None
    try:
        while True:
            left = durable.wait_left(rid, deadline)
            try:
                message = await asyncio.wait_for(inbox.get(), left)
            except TimeoutError:
                continue
            outcome = calls.outcome(rid.guid, message)
            if outcome is None:  # not an answer (a stray heartbeat): drop it
                _confirm(message)
                continue
            await _keep_fetchable(queue, message, rid, deadline)
            if isinstance(outcome, RpcError):
                raise outcome
            return durable.with_streams(
                outcome,
                message,
                rid.guid,
                functools.partial(streaming.readers, session),
                streaming.AsyncTakenReader,
            )
    finally:
        with contextlib.suppress(HoldfastError):
            await queue.close(timeout=5)


async def _keep_fetchable(
    queue: Queue, message: Message, rid: durable.RequestId, deadline: float
) -> None:
    """As ``holdfast.sdk.rpc.durable``: a fresh copy first, then the CONFIRM."""
    kept = durable.kept_copy(message, rid)
    if kept is not None:
        acked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        def on_ack(ack: Ack) -> None:
            if not acked.done():
                acked.set_result(ack.status.ok)

        try:
            with tracing.suppressed():  # the SDK's own copy of the reply: no send span
                await queue.post(message.payload, kept, on_ack)
            ok = await asyncio.wait_for(acked, max(1.0, deadline - time.monotonic()))
        except (HoldfastError, TimeoutError):
            return  # not copied: the delivered one stays (returned when the queue closes)
        if not ok:
            return
    try:
        await queue.configure(durable.NO_MORE, timeout=5)
    except (HoldfastError, TimeoutError):
        return
    _confirm(message)


def _confirm(message: Message) -> None:
    with contextlib.suppress(HoldfastError):  # returned to the queue: fetchable again
        message.confirm()
