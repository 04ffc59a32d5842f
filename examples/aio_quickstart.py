"""The README's asyncio example: post, flush, then read back with ``async for``."""

import asyncio

from holdfast.sdk.aio import Session


async def main() -> None:
    async with Session() as session:  # $HOLDFAST_ADDRESS or 127.0.0.1:7701
        queue = await session.open_queue("hf://demo/aio-orders", write=True)
        for i in range(100):
            await queue.post(b"order %d" % i, properties={"seq": str(i)})
        assert await session.flush(timeout=30)

        inbox = await session.open_queue("hf://demo/aio-orders", read=True)
        received = 0
        async for message in inbox:
            message.confirm()
            received += 1
            if received == 100:
                await inbox.close()  # ends the iteration
    print(f"posted 100, received {received}")


asyncio.run(main())
