"""Turns of the event loop before a small write, so that small answers leave together.

A writer woken by the first answer of a burst would send it alone, and then one
gRPC message per answer: each message costs every hop far more than the frames
in it (grpc.aio's write and read, the poller thread's hand-over of the interpreter
lock), so a loaded hop that writes small messages spends its CPU on messages and
stays loaded (request/reply through the proxy ran at 2.6-3.0k or 4.6-6.6k calls/s
in runs of the same code: ``bench/PROFILE.md``, "Small writes"). Before it takes
what is queued, a writer therefore lets the loop run once, and, when its last
message was small, up to ``EXTRA_TURNS`` more times while other callbacks are
ready to run: frames gRPC has already read are handled first, and what they
answer joins the write. A writer of big messages (a bulk producer's ACKs) pays
one turn; an idle loop pays nothing more, as nothing else is ready.

Both writers use it: the served stream's (``holdfast.server.stream``) and the
asyncio driver's (``holdfast.sdk.driver.aio``, the proxy's upstream and the
asyncio SDK).
"""

from __future__ import annotations

import asyncio

SMALL_WRITE_BYTES = 64 * 1024
"""A last message under this many bytes makes the writer wait the extra turns."""
EXTRA_TURNS = 2
"""Turns a writer of small messages waits at most, while other callbacks are ready:
request/reply is as fast with 2 as with 8, and 8 cost bulk messaging 8-12 %
(``bench/PROFILE.md``, "Small writes")."""


async def before_taking(last_write_bytes: int) -> None:
    """Let the loop run what is ready before a woken writer takes its frames."""
    await asyncio.sleep(0)
    if last_write_bytes >= SMALL_WRITE_BYTES:
        return
    # The ready queue of asyncio's own loops; another loop (uvloop) gets one turn.
    ready = getattr(asyncio.get_running_loop(), "_ready", None)
    for _ in range(EXTRA_TURNS):
        if not ready:
            return
        await asyncio.sleep(0)
