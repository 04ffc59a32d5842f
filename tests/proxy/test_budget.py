"""``BufferBudget``: the proxy's buffer bound, apportioned among its clients."""

from __future__ import annotations

import asyncio

import pytest

from holdfast.proto import pb
from holdfast.proxy.budget import BufferBudget
from holdfast.proxy.routes import Routes

pytestmark = pytest.mark.timeout(10)


def test_a_client_at_its_share_is_not_read_and_the_others_are() -> None:
    budget = BufferBudget(1000)
    budget.connect(1)
    budget.connect(2)
    assert budget.share == 500
    budget.charge(1, 450)
    budget.read(1, 100)  # its frames are 100 bytes: 450 + 100 would pass its share
    assert not budget.may_read(1)
    assert budget.may_read(2)
    budget.release(1, 100)
    assert budget.may_read(1)
    assert budget.total == 350 and budget.peak == 450


def test_a_client_holding_nothing_may_send_one_frame_of_any_size_into_an_empty_proxy() -> None:
    budget = BufferBudget(10)
    budget.connect(1)
    budget.read(1, 1000)
    assert budget.may_read(1)
    budget.charge(1, 1000)
    assert not budget.may_read(1)


def test_frames_larger_than_their_senders_shares_do_not_stop_a_client_under_its_own() -> None:
    """Six clients of a 600-byte bound (shares of 100, a slack of 75): the first four
    send one frame of 150 each while holding nothing, so the proxy holds 600. The fifth
    frame would take it to 750: refused. The sixth client, holding 20 of its 100 with
    frames of 10, is read still; each of the four waits for its ACKs."""
    budget = BufferBudget(600)
    for key in range(6):
        budget.connect(key)
    for key in range(4):
        assert budget.may_read(key)
        assert budget.admits(key, 150)
        budget.read(key, 150)
        budget.charge(key, 150)
        assert not budget.may_read(key)
    assert budget.may_read(4)
    assert not budget.admits(4, 150)
    assert budget.refused == 1
    assert not budget.may_read(4)  # no room for a frame of 150 until some are ACKed
    budget.read(5, 10)
    budget.charge(5, 20)
    assert budget.total == 620
    assert budget.may_read(5)
    budget.charge(5, 75)
    assert not budget.may_read(5)  # 95 + a 10-byte frame would pass its share


def test_the_proxy_never_holds_more_than_its_bound_and_slack_but_one_frame_when_empty() -> None:
    """However many clients holding nothing send a frame at once, what is admitted stays
    within the bound plus its slack; only into an empty proxy does a frame of any size go."""
    budget = BufferBudget(800)  # a slack of 100
    for key in range(20):
        budget.connect(key)
    taken = 0
    for key in range(20):
        if budget.admits(key, 300):
            budget.charge(key, 300)
            taken += 1
    assert taken == 3 and budget.total == 900 == budget.max_bytes + budget.slack
    assert budget.refused == 17
    alone = BufferBudget(10)
    alone.connect(1)
    assert alone.admits(1, 5000)


def test_room_for_one_frame_wakes_one_refused_client_not_all() -> None:
    async def scenario() -> None:
        budget = BufferBudget(800)
        for key in range(4):
            budget.connect(key)
        budget.charge(0, 800)
        for key in (1, 2, 3):
            assert not budget.admits(key, 300)
        waiters = [asyncio.ensure_future(budget.wait_for_room(key)) for key in (1, 2, 3)]
        await asyncio.sleep(0)
        budget.release(0, 300)  # room for one frame of 300 (800 - 300 + 300 <= 900)
        budget.wake()
        await asyncio.sleep(0)
        assert [w.done() for w in waiters] == [True, False, False]
        # The woken client sends nothing: its room is given on after a while.
        await asyncio.wait_for(asyncio.gather(waiters[1]), 5)
        assert not waiters[2].done()
        budget.release(0, 500)
        budget.wake()
        await asyncio.wait_for(asyncio.gather(*waiters), 5)

    asyncio.run(scenario())


def test_the_total_bound_holds_when_a_new_client_joins_a_full_proxy() -> None:
    budget = BufferBudget(1000)
    budget.connect(1)
    budget.charge(1, 990)
    budget.connect(2)
    budget.charge(2, 5)
    budget.read(2, 10)
    assert not budget.may_read(2)  # 995 + 10 would pass the bound
    budget.release(1, 500)
    assert budget.may_read(2)
    budget.read(1, 20)
    assert not budget.may_read(1)  # 490 + a 20-byte frame would pass its share of 500


def test_a_departing_client_frees_its_share_but_not_its_bytes() -> None:
    budget = BufferBudget(1000)
    budget.connect(1)
    budget.connect(2)
    budget.charge(2, 400)
    budget.read(2, 200)
    assert not budget.may_read(2)
    budget.charge(1, 300)
    budget.disconnect(1)
    assert budget.share == 1000
    assert budget.may_read(2)
    assert budget.total == 700  # its PUTs are still buffered upstream
    budget.release(1, 300)
    assert budget.total == 400 and budget.held(1) == 0


def test_a_waiting_client_is_woken_when_its_puts_are_acked() -> None:
    async def scenario() -> None:
        budget = BufferBudget(100)
        budget.connect(1)
        budget.charge(1, 100)
        waiter = asyncio.ensure_future(budget.wait_for_room(1))
        await asyncio.sleep(0)
        assert not waiter.done()
        budget.release(1, 60)
        budget.wake()
        await asyncio.wait_for(waiter, 5)

    asyncio.run(scenario())


def test_routes_release_the_charge_with_the_ack_and_move_a_departed_clients() -> None:
    routes = Routes(1000)
    budget = routes.budget

    class Client:
        def __init__(self) -> None:
            self.acks: list[tuple[int, bytes, int]] = []

        def ack(self, queue_id: int, guid: bytes, status: int) -> None:
            self.acks.append((queue_id, guid, status))

        def ack_rows(self, rows: list[tuple[int, bytes, int]]) -> None:
            self.acks += rows

    first, second = Client(), Client()
    key1 = routes.register(first)  # type: ignore[arg-type]
    guid = b"g" * 16
    budget.charge(key1, 120)
    routes.add(guid, key1, 1, 120)
    routes.unregister(key1)
    key2 = routes.register(second)  # type: ignore[arg-type]
    routes.add(guid, key2, 3)  # the client came back and joined its pending PUT
    assert budget.held(key1) == 0 and budget.held(key2) == 120
    routes.on_acks([(guid, pb.STATUS_OK)])
    assert second.acks == [(3, guid, pb.STATUS_OK)] and first.acks == []
    assert budget.total == 0


def test_a_newcomer_to_a_proxy_one_client_filled_sends_into_the_slack_then_waits_for_acks() -> None:
    """docs/operations.md: one client filled the bound during an outage; a newcomer
    holding nothing may send a frame that fits the slack, and is then pushed back too.
    Once ACKs free room, the client that filled it, over its share, is not read, and
    the newcomer is."""
    budget = BufferBudget(800)  # a slack of 100
    budget.connect(1)
    budget.read(1, 50)
    budget.charge(1, 800)
    budget.connect(2)
    assert not budget.may_read(1)  # 800 of a share of 400
    assert budget.may_read(2) and budget.admits(2, 60)
    budget.read(2, 60)
    budget.charge(2, 60)
    assert not budget.may_read(2)  # past the bound, and nothing over it is its own
    assert not budget.admits(2, 60)  # a frame already on its way: past the slack
    budget.release(1, 300)  # the broker is back: ACKs of the first client's PUTs
    assert not budget.may_read(1)  # 500 of its 400
    assert budget.may_read(2)
