"""The broker's gRPC message limit is the frame size of the limits it announces and
enforces (``Limits.max_frame_bytes``), not an unrelated number."""

from __future__ import annotations

import grpc
import pytest

from holdfast.broker import Broker
from holdfast.proto import pb
from tests.broker.test_in_process import AioClient, GatedStore, run_with_broker
from tests.broker.util import new_guid, unique_uri

MAX_PAYLOAD = 1000


def test_every_frame_the_limits_allow_gets_a_typed_answer_and_no_bigger_one_is_read() -> None:
    uri = unique_uri("frame-limit")

    async def scenario(broker: Broker, store: GatedStore) -> None:
        limits = broker.config.limits
        assert limits.max_payload_bytes == MAX_PAYLOAD
        frame_limit = limits.max_frame_bytes
        client = await AioClient.connect(broker.address)
        await client.open(1, uri, write=True)
        # A payload far over the announced limit, in a frame within the frame limit:
        # refused with its typed ACK, and the stream goes on.
        over = new_guid()
        await client.put(1, [over], payload=b"x" * (frame_limit - 1024))
        (ack,) = await client.acks(1)
        assert (ack.guid, ack.status) == (over, pb.STATUS_PAYLOAD_TOO_LARGE)
        fine = new_guid()
        await client.put(1, [fine], payload=b"x" * MAX_PAYLOAD)
        assert [a.status for a in await client.acks(1)] == [pb.STATUS_OK]
        # A frame over the limit breaks the contract: gRPC refuses it.
        rogue = await AioClient.connect(broker.address)
        await rogue.open(1, uri, write=True)
        await rogue.put(1, [new_guid()], payload=b"x" * (frame_limit + 1))
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await rogue.recv()
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        await rogue.close()
        await client.close()

    run_with_broker(scenario, max_payload_bytes=MAX_PAYLOAD)
