"""Running the handler of an asyncio ``Worker`` (``holdfast.sdk.aio.worker``) for one
request, and the reply its outcome makes.

Whatever the handler raises is the caller's to see (``RemoteHandlerError``), as on the
threaded worker: ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``, any other
``BaseException``, and a ``CancelledError`` of its own (one from a helper task that
something else cancelled). Left to escape, they ended the worker's task with the call
unanswered, its request held unconfirmed and its slot taken for good (or, for
``SystemExit`` and ``KeyboardInterrupt``, stopped the event loop). Only a cancel of the
handler's task itself is not an answer: its caller's cancel, or the worker closing.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from holdfast.sdk.aio import streams as streaming
from holdfast.sdk.rpc import calls, chunks, wire
from holdfast.sdk.rpc.jobs import Answer, Job
from holdfast.sdk.rpc.values import Request, StreamingReply

if TYPE_CHECKING:
    from holdfast.sdk.aio.session import Session

log = logging.getLogger("holdfast.sdk.rpc.worker")


async def call(handler: Callable[[Request], Any], coroutine: bool, request: Request) -> Any:
    """What ``handler`` returns for ``request``: awaited if a coroutine function, else
    run in the loop's default executor (a plain function that returns an awaitable has
    it awaited)."""
    if coroutine:
        result = await handler(request)
    else:
        loop = asyncio.get_running_loop()
        result, error = await loop.run_in_executor(None, _guarded, handler, request)
        if error is not None:
            raise error
    if inspect.isawaitable(result):
        result = await result
    return result


def _guarded(
    handler: Callable[[Request], Any], request: Request
) -> tuple[Any, BaseException | None]:
    """In the executor: what ``handler`` returns, or what it raised, returned to be raised
    in the awaiting coroutine. Had the executor's future held it, a ``GeneratorExit`` was
    thrown into the worker's task, and Python throws that one into the outermost frame
    only, closing every frame in between: no frame of the worker's could answer it."""
    try:
        return handler(request), None
    except BaseException as error:  # SystemExit too: off the main thread, no signal's
        return None, error


def cancelled_from_outside(error: BaseException, task: asyncio.Task[Any]) -> bool:
    """True if ``error`` is the cancel of the handler's ``task`` itself (its caller's
    cancel, the worker closing, the loop ending); False for anything the handler raised
    on its own, a ``CancelledError`` from a task it awaited included: that task, not
    this one, was cancelled, so ``task.cancelling()`` is 0."""
    return isinstance(error, asyncio.CancelledError) and task.cancelling() > 0


def answer(
    session: Session,
    job: Job,
    result: Any,
    keep: Callable[[asyncio.Task[Any]], None],
) -> Answer:
    """The reply to post for the handler's ``result`` (bad properties or stream names
    raise: an error reply); the streams of a ``StreamingReply`` start now, their sender
    tasks handed to ``keep``."""
    guid = job.request.guid
    if isinstance(result, StreamingReply):
        headers = chunks.streaming_reply_properties(guid, result.properties, result.streams)
        senders = streaming.start_senders(
            session,
            calls.domain_of(job.reply_to),
            wire.reply_guid(guid),
            result.streams,
            lambda error, _: log.warning("reply stream of %s failed: %s", guid, error),
            chunks.REPLY_CREDIT_TIMEOUT,
        )
        for task in senders:
            keep(task)
        return wire.payload_bytes(result.payload), headers
    if isinstance(result, tuple):
        payload, properties = result
        user = wire.check_user_properties(properties)
        return wire.payload_bytes(payload), wire.reply_properties(guid, user)
    return wire.payload_bytes(result), wire.reply_properties(guid, {})


__all__ = ["answer", "call", "cancelled_from_outside"]
