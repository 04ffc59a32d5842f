"""The README's consumer: reads what the producer posted and confirms each message."""

import time
import uuid

from holdfast.sdk import Message, QueueOptions, Session

seen: set[uuid.UUID] = set()


def handle(message: Message) -> None:  # runs on the session's callback thread
    seen.add(message.guid)
    message.confirm()  # the broker removes it; unconfirmed messages are redelivered


with Session() as session:
    session.open_queue(
        "hf://demo/orders",
        read=True,
        on_message=handle,
        options=QueueOptions(max_unconfirmed_messages=1000),
    )
    deadline = time.monotonic() + 60
    while len(seen) < 1000 and time.monotonic() < deadline:
        time.sleep(0.1)
print(f"consumed {len(seen)} distinct messages")
