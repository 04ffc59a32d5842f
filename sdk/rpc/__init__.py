"""Request/reply over queues: calls that survive worker, proxy and broker loss.

::

    from holdfast.sdk import Session, Worker

    with Session(address) as session, Worker(session, "hf://demo/echo", lambda r: r.payload):
        ...

    with Session(address) as session:
        reply = session.request("hf://demo/echo", b"hi", timeout=10)

    request_id = session.request_durable("hf://demo/echo", b"later", keep=3600)
    reply = session.fetch_reply(request_id, timeout=10)  # any session, any process

Modules: ``wire`` (reserved properties, reply GUIDs, message kinds), ``calls`` (the
rules of one call, shared by both callers), ``caller`` (``Session.request`` /
``request_async``), ``durable`` (``request_durable`` / ``fetch_reply``, replies by
id), ``worker`` (``Worker``) with ``jobs`` and ``liveness``, ``values`` (``Reply``,
``Request``, ``StreamingReply``), ``chunks`` (the rules of data streams, shared by
both front-ends) and ``streams`` (data streams, threaded), ``options``
(``WorkerOptions``), ``api`` (the ``RequestReply`` mixin
that gives ``Session`` its ``request`` methods). The asyncio caller, worker and
data streams are ``holdfast.sdk.aio.rpc``, ``holdfast.sdk.aio.worker`` and
``holdfast.sdk.aio.streams``. Errors are under
``holdfast.sdk.errors.RpcError``.
"""

from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.rpc.values import Reply, Request, StreamingReply
from holdfast.sdk.rpc.worker import Worker

__all__ = ["Reply", "Request", "StreamingReply", "Worker", "WorkerOptions"]
