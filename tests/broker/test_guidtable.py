"""``PackedGuids``: the packed GUID table of the dedup history, against a dict model."""

from __future__ import annotations

import random
import uuid

import pytest

from holdfast.broker.dedup import GuidHistory, HistoryBudget
from holdfast.broker.guidtable import (
    MAX_GENERATIONS,
    RECORDS_PER_PARTITION,
    SWEEP_GENERATIONS,
    YOUNG_GUIDS,
    PackedGuids,
)

pytestmark = pytest.mark.timeout(60)


def guid(rng: random.Random) -> bytes:
    return rng.getrandbits(128).to_bytes(16, "big")


def test_records_are_found_with_their_signed_digests_across_splits() -> None:
    rng = random.Random(1)
    table = PackedGuids()
    table.newest = table.oldest = 0
    model = {guid(rng): rng.randrange(-(2**63), 2**63) for _ in range(RECORDS_PER_PARTITION * 50)}
    for key, digest in model.items():
        assert table.add(key, digest)
    assert len(table) == len(model)
    for key, digest in model.items():
        assert table.get(key) == digest
        assert not table.add(key, 0)  # held already: unchanged
        assert table.get(key) == digest
    assert all(table.get(guid(rng)) is None for _ in range(5000))


def test_guids_sharing_their_fingerprint_and_bytes_elsewhere_are_told_apart() -> None:
    # GUIDs equal but for one byte, many to a partition: fingerprints collide often.
    table = PackedGuids()
    table.newest = table.oldest = 0
    keys = [bytes(15) + bytes([i]) for i in range(256)] + [
        bytes([i]) + bytes(15) for i in range(1, 256)
    ]
    for number, key in enumerate(keys):
        assert table.add(key, number)
    for number, key in enumerate(keys):
        assert table.get(key) == number


@pytest.mark.parametrize("per_generation", [1, 3, 8, 9, 500])
def test_expired_generations_are_not_answered_and_their_guids_may_return(
    per_generation: int,
) -> None:
    """Also for a generation of a few GUIDs, which ``begin`` packs one by one
    (``SMALL_FLUSH``) rather than by the batch path."""
    rng = random.Random(2)
    table = PackedGuids()
    table.newest = table.oldest = 0
    first = [guid(rng) for _ in range(per_generation)]
    for key in first:
        table.add(key, 1)
    table.begin(1)
    second = [guid(rng) for _ in range(per_generation)]
    for key in second:
        table.add(key, 2)
    table.oldest = 1  # generation 0 expired
    assert all(table.get(key) is None for key in first)
    assert all(table.get(key) == 2 for key in second)
    table.sweep(1)
    assert table.add(first[0], 3) and table.get(first[0]) == 3


def test_a_long_run_of_generations_matches_a_dict_model() -> None:
    """Hundreds of generations (tags wrap modulo 256), random expiry, sweeps: the table
    answers exactly what a dict of the alive generations would."""
    rng = random.Random(3)
    table = PackedGuids()
    alive: dict[int, dict[bytes, int]] = {}
    oldest = 0
    for generation in range(700):
        table.begin(generation)
        if not alive:
            table.oldest = oldest = generation
        batch = alive.setdefault(generation, {})
        for _ in range(rng.randrange(0, 60)):
            key = guid(rng) if rng.random() < 0.9 else rng.choice(list(batch) or [guid(rng)])
            known = any(key in held for held in alive.values())
            assert table.add(key, generation) is not known
            if not known:
                batch[key] = generation
        while len(alive) > rng.randrange(1, 120) or len(alive) >= MAX_GENERATIONS:
            del alive[oldest]
            oldest += 1
            table.oldest = oldest
            table.sweep(1)
        for held in alive.values():
            for key in rng.sample(list(held), min(3, len(held))):
                assert table.get(key) == held[key]
    expired = [guid(rng) for _ in range(200)]
    assert all(table.get(key) is None for key in expired)
    assert len(table) >= sum(len(held) for held in alive.values())


def test_guids_of_other_lengths_are_held_too() -> None:
    table = PackedGuids()
    table.newest = table.oldest = 0
    assert table.add(b"g", 5) and not table.add(b"g", 6)
    assert table.get(b"g") == 5
    table.begin(1)
    table.oldest = 1
    assert table.get(b"g") is None
    table.sweep(1)
    assert table.add(b"g", 7) and table.get(b"g") == 7


def test_a_history_never_keeps_more_generations_than_tags_allow() -> None:
    now = [0.0]
    history = GuidHistory(window=10.0, grace=0.0, budget=HistoryBudget(10**6), clock=lambda: now[0])
    # Entries accepted further and further ahead: each would start a bucket of its own.
    for number in range(MAX_GENERATIONS * 2):
        history.record(uuid.uuid4().bytes, number, number * 10.0)
    assert len(history) == MAX_GENERATIONS * 2
    assert len(history._buckets) <= MAX_GENERATIONS


def test_a_batch_recorded_at_once_is_held_like_guids_recorded_one_by_one() -> None:
    rng = random.Random(7)
    now = [0.0]
    budgets = HistoryBudget(10**6), HistoryBudget(10**6)
    one, batch = (
        GuidHistory(window=10.0, grace=0.0, budget=budget, clock=lambda: now[0])
        for budget in budgets
    )
    for frame in range(40):
        at = frame * 0.5
        now[0] = at
        guids = [guid(rng) for _ in range(rng.randrange(1, 200))] + [b"odd"] * (frame == 3)
        digests = [rng.randrange(-(2**63), 2**63) for _ in guids]
        for key, digest in zip(guids, digests, strict=True):
            one.record(key, digest, at, known_new=True)
        batch.record_new(guids, digests, at)
        assert len(batch) == len(one) and budgets[1].held == budgets[0].held
        assert len(batch._buckets) == len(one._buckets)
        assert [b[2] for b in batch._buckets] == [b[2] for b in one._buckets]
        assert all(batch.get(k) == d for k, d in zip(guids, digests, strict=True))
    now[0] = 100.0
    assert one.expire() == batch.expire() > 0
    assert len(batch) == 0 == budgets[1].held
    batch.record_new([guid(rng)], [1], 50.0)  # past its retention already: not kept
    assert len(batch) == 0


def test_guids_in_time_order_are_answered_exactly_around_the_greatest_one() -> None:
    """uuid7 GUIDs mostly increase, and the table answers a GUID above the greatest it
    was given without a lookup: each one given is found (the greatest too), one never
    given is not, above or below it, and one given out of order is found."""
    table = PackedGuids()
    table.newest = table.oldest = 0
    ordered = [(n << 64 | 0xABC).to_bytes(16, "big") for n in range(1, 3000, 2)]
    for number, key in enumerate(ordered):
        assert table.add(key, number)
    assert all(table.get(key) == number for number, key in enumerate(ordered))
    between = [(n << 64 | 0xABC).to_bytes(16, "big") for n in range(2, 3000, 200)]
    assert all(table.get(key) is None for key in between)  # below the greatest
    above = (3001 << 64).to_bytes(16, "big")
    assert table.get(above) is None
    late = between[3]  # from a producer whose clock is behind
    assert table.add(late, -1) and not table.add(late, -2)
    assert table.get(late) == -1 and table.get(ordered[-1]) == len(ordered) - 1
    table.clear()
    assert table.get(ordered[-1]) is None and table.add(ordered[0], 9)
    assert table.get(ordered[0]) == 9


def test_a_batch_raises_the_greatest_guid_too_whatever_its_order_and_lengths() -> None:
    table = PackedGuids()
    table.newest = table.oldest = 0
    keys = [(n << 64).to_bytes(16, "big") for n in (5, 9, 2)]
    table.add_new([*keys, b"\x00odd"], [5, 9, 2, 0])
    assert [table.get(key) for key in keys] == [5, 9, 2]
    assert table.get(b"\x00odd") == 0
    table.add_new([b"\xffodd", (11 << 64).to_bytes(16, "big")], [-5, 11])
    assert table.get((11 << 64).to_bytes(16, "big")) == 11
    assert table.get(b"\xffodd") == -5
    table.add_new([], [])
    assert len(table) == 6 and table.get((11 << 64).to_bytes(16, "big")) == 11


def test_many_producers_with_clocks_apart_match_a_dict_model() -> None:
    """GUIDs of several producers whose clocks differ by seconds, interleaved, some
    repeated, over generations that expire: the table answers what a dict would."""
    rng = random.Random(11)
    table = PackedGuids()
    alive: dict[int, dict[bytes, int]] = {}
    clocks = [rng.randrange(0, 5000) for _ in range(6)]
    for generation in range(300):
        table.begin(generation)
        if not alive:
            table.oldest = generation
        batch = alive.setdefault(generation, {})
        for _ in range(rng.randrange(0, 80)):
            producer = rng.randrange(len(clocks))
            clocks[producer] += rng.randrange(0, 3)
            key = (clocks[producer] << 80 | rng.getrandbits(80)).to_bytes(16, "big")
            if batch and rng.random() < 0.1:
                key = rng.choice(list(batch))
            known = next((held[key] for held in alive.values() if key in held), None)
            assert table.get(key) == known
            assert table.add(key, generation) is (known is None)
            if known is None:
                batch[key] = generation
        if len(alive) > rng.randrange(2, 60):
            del alive[table.oldest]
            table.oldest += 1
            table.sweep(1)


def test_an_expired_record_no_sweep_reached_is_not_answered_generations_later() -> None:
    """Sweeps remove expired records in slices; one still in its partition when the
    generations alive have moved far past it is not answered."""
    table = PackedGuids()
    table.newest = table.oldest = 0
    early = [bytes([n]) * 16 for n in range(1, 40)]
    table.add_new(early, list(range(len(early))))
    for generation in range(1, 136):
        table.begin(generation)
    table.oldest = 100  # generations 0-99 expired; nothing swept
    assert all(table.get(key) is None for key in early)
    late = bytes([200]) * 16
    assert table.add(late, 7) and table.get(late) == 7


@pytest.mark.parametrize("most", [40, 2])
def test_expired_records_never_answer_when_their_tags_come_round(most: int) -> None:
    """A history's use of the table over 1,000 generations, near four turns of the
    8-bit tags: GUIDs of 16 bytes and of other lengths, added one by one and by the
    batch; the oldest generations expire, a sweep each. Every GUID of a generation
    alive is found; none of an expired one is, also once its tag names a generation
    alive again (a record the sweeps missed would be answered then). Also for a
    history of a GUID or two a generation, whose table stays a few partitions."""
    rng = random.Random(5)
    table = PackedGuids()
    alive: dict[int, dict[bytes, int]] = {}
    expired: dict[int, list[bytes]] = {}
    oldest = 0
    for generation in range(1000):
        table.begin(generation)
        if not alive:
            table.oldest = oldest = generation
        keys = [guid(rng) for _ in range(rng.randrange(0, most))]
        keys += [rng.randbytes(rng.choice((3, 20))) for _ in range(rng.randrange(0, 3))]
        if rng.random() < 0.5:
            table.add_new(keys, [generation] * len(keys))
        else:
            assert all(table.add(key, generation) for key in keys)
        alive[generation] = dict.fromkeys(keys, generation)
        # Several generations may expire at once (a history idle for a while).
        gone = max(0, len(alive) - rng.randrange(20, 150))
        for _ in range(gone):
            expired[oldest] = list(alive.pop(oldest))
            oldest += 1
        if gone:
            table.oldest = oldest
            table.sweep(gone)
        for held in alive.values():
            for key in rng.sample(list(held), min(2, len(held))):
                assert table.get(key) == held[key]
        for back in (256, 512, 768, rng.randrange(1, 256)):
            for key in expired.get(generation - back, ()):
                assert table.get(key) is None, (generation, back)


def test_the_table_counts_what_it_holds_and_packs_young_guids_by_the_thousand() -> None:
    """``len`` counts packed, young and odd-length GUIDs; young GUIDs wait in a dict of
    at most ``YOUNG_GUIDS`` (about 100 B each, against 26 B packed), also when one
    batch brings more than that."""
    rng = random.Random(13)
    table = PackedGuids()
    table.begin(0)
    table.oldest = 0
    for _ in range(5):
        table.add(guid(rng), 1)
    table.begin(1)  # packs the five
    for _ in range(3):
        table.add(guid(rng), 2)
    table.add(b"odd", 3)
    assert len(table) == 9
    for _ in range(3000):
        table.add(guid(rng), 4)
        assert len(table._young) < YOUNG_GUIDS
    table.add_new([guid(rng) for _ in range(2500)], [5] * 2500)
    assert len(table._young) < YOUNG_GUIDS
    assert len(table) == 9 + 3000 + 2500


@pytest.mark.parametrize("partitions", [5, 40, 300])
@pytest.mark.parametrize("steps", [(1, 1, 1, 1), (2, 2), (4,)])
def test_every_partition_is_swept_within_sweep_generations_expired(
    steps: tuple[int, ...], partitions: int
) -> None:
    """Expired records go by sweeps of a slice of the partitions each; whatever slices
    the expiries come in, ``SWEEP_GENERATIONS`` expired generations sweep them all,
    twice round (the second from where the first stopped)."""
    rng = random.Random(17)
    table = PackedGuids()
    table.begin(0)
    table.oldest = 0
    assert sum(steps) == SWEEP_GENERATIONS
    for round_ in (1, 2):
        generation = round_ * SWEEP_GENERATIONS
        # Bytes that read as the live generation's tag wherever a record is not its tag.
        keys = [
            bytes([generation]) + guid(rng)[1:] for _ in range(RECORDS_PER_PARTITION * partitions)
        ]
        table.add_new(keys, [generation] * len(keys))
        table.begin(generation)  # packs them
        table.oldest = generation
        for generations in steps:
            table.sweep(generations)
        assert len(table) == 0


def test_a_cleared_table_holds_new_guids_like_a_new_one() -> None:
    """After ``clear`` (a queue deleted by an operator) the history begins a new
    generation and records again: packed into partitions, found, and nothing else."""
    rng = random.Random(19)
    table = PackedGuids()
    table.begin(0)
    table.oldest = 0
    table.add_new([guid(rng) for _ in range(3000)], [1] * 3000)
    table.begin(1)
    table.clear()
    table.begin(2)
    table.oldest = 2
    model = {guid(rng): rng.randrange(-(2**63), 2**63) for _ in range(3000)}
    table.add_new(list(model), list(model.values()))
    table.begin(3)  # packs them
    assert len(table) == len(model)
    assert all(table.get(key) == digest for key, digest in model.items())
    assert all(table.get(guid(rng)) is None for _ in range(2000))


def test_a_table_past_a_thousand_partitions_finds_every_guid() -> None:
    """Linear hashing through levels whose partition counts are past the small ints
    Python shares (256): every GUID is found, none other."""
    rng = random.Random(23)
    table = PackedGuids()
    table.begin(0)
    table.oldest = 0
    model = {guid(rng): n for n in range(RECORDS_PER_PARTITION * 1100)}
    for key, digest in model.items():  # packed a thousand at a time: splits move records
        table.add(key, digest)
    table.begin(1)
    assert all(table.get(key) == digest for key, digest in model.items())
    assert all(table.get(guid(rng)) is None for _ in range(2000))
