"""The asyncio API of the Holdfast SDK: the same contract and engine, awaited.

::

    from holdfast.sdk.aio import Session

    async with Session("127.0.0.1:7701") as session:
        queue = await session.open_queue("hf://demo/orders", write=True)
        guid = await queue.post(b"payload", properties={"k": "v"})
        assert await session.flush(timeout=30)

        inbox = await session.open_queue("hf://demo/orders", read=True)
        async for message in inbox:
            message.confirm()

Request/reply runs on the loop too: ``await session.request(uri, payload)`` and
``async with Worker(session, uri, handler)`` (``holdfast.sdk.aio.worker``), with data
streams: ``await session.request(uri, payload, streams={"upload": f})`` and, in the
handler, ``async for chunk in request.streams["upload"]`` (``AsyncStreamReader``,
``holdfast.sdk.aio.streams``).

Callbacks run on the event loop; ``post`` awaits rule 7's high-watermark wait
instead of blocking the loop. Errors, events, options and ``AckStatus`` are those
of ``holdfast.sdk``.
"""

from holdfast.sdk.aio.queue import Queue
from holdfast.sdk.aio.session import Session
from holdfast.sdk.aio.streams import AsyncStreamReader
from holdfast.sdk.aio.worker import Worker

__all__ = ["AsyncStreamReader", "Queue", "Session", "Worker"]
