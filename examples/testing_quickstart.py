"""The README's testing example: the real broker in this process, with fault hooks."""

from holdfast.sdk import Ack, AckStatus, Session
from holdfast.sdk.testing import Broker

acks: list[Ack] = []
with Broker() as broker:
    with Session(broker.address, transport=broker.transport()) as session:
        queue = session.open_queue("hf://test/orders", write=True, on_ack=acks.append)
        broker.fail_next_puts(1, AckStatus.STORE_ERROR)  # the next PUT is refused
        queue.post(b"refused")
        broker.drop_connections()  # a network fault: the session reconnects by itself
        queue.post(b"delivered once, whatever the drop")
        assert session.flush(timeout=10)
    assert broker.depth("hf://test/orders") == 1
assert [ack.status for ack in acks] == [AckStatus.STORE_ERROR, AckStatus.SUCCESS]
print("refused 1, delivered 1")
