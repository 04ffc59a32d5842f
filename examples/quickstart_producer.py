"""The README's producer: 1000 PUTs through the local proxy, each ACKed once."""

from holdfast.sdk import AckStatus, Session

statuses: list[AckStatus] = []
with Session() as session:  # $HOLDFAST_ADDRESS or 127.0.0.1:7701
    queue = session.open_queue("hf://demo/orders", write=True)
    for i in range(1000):
        queue.post(
            b"order %d" % i,
            properties={"seq": str(i)},
            on_ack=lambda ack: statuses.append(ack.status),
        )
    assert session.flush(timeout=30)  # every PUT answered, and its on_ack has run
assert statuses.count(AckStatus.SUCCESS) == 1000, statuses
print("posted 1000, ACKed SUCCESS 1000")
