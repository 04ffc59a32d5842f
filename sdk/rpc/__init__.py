"""Request/reply over queues: calls that survive worker, proxy and broker loss.

::

    from holdfast.sdk import Session, Worker

    with Session(address) as session, Worker(session, "hf://demo/echo", lambda r: r.payload):
        ...

    with Session(address) as session:
        reply = session.request("hf://demo/echo", b"hi", timeout=10)

Modules: ``wire`` (reserved properties, reply GUIDs, message kinds), ``caller``
(``Session.request``/``request_async``), ``worker`` (``Worker``), ``values``
(``Reply``, ``Request``), ``options`` (``WorkerOptions``), ``api`` (the
``RequestReply`` mixin that gives ``Session`` its ``request`` methods). Errors are under
``holdfast.sdk.errors.RpcError``.
"""

from holdfast.sdk.rpc.options import WorkerOptions
from holdfast.sdk.rpc.values import Reply, Request
from holdfast.sdk.rpc.worker import Worker

__all__ = ["Reply", "Request", "Worker", "WorkerOptions"]
