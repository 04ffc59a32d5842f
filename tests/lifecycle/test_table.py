"""The lifecycle table itself: every cell, every guard, every refusal."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from holdfast.broker.lifecycle import (
    RELEASES,
    TERMINAL,
    TRANSITIONS,
    Admission,
    Effect,
    Event,
    Guard,
    IllegalTransition,
    Message,
    Rules,
    State,
    admit,
    apply,
    before_delivery,
    expired,
    pickup_missed,
    release,
    rows,
    spent,
    stage_expired,
)
from holdfast.proto.policy import REASON_DELIVERY_LIMIT, REASON_EXPIRED, REASON_REJECTED

RULES = Rules(max_deliveries=3, ttl=10.0)


def test_every_cell_ends_in_an_always_row_and_terminal_states_take_nothing() -> None:
    cells = {(row.state, row.event) for row in TRANSITIONS}
    for state, event in cells:
        assert rows(state, event)[-1].guard is Guard.ALWAYS, (state, event)
    for state, event in itertools.product(State, Event):
        if state in TERMINAL:
            assert (state, event) not in cells
            with pytest.raises(IllegalTransition):
                apply(Message(state), event, 0.0, RULES)


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (State.READY, Event.CONFIRM),
        (State.READY, Event.REJECT),
        (State.READY, Event.SESSION_LOST),
        (State.READY, Event.DUE),
        (State.HELD, Event.DELIVER),
        (State.HELD, Event.DUE),
        (State.DELAYED, Event.DELIVER),
        (State.DELAYED, Event.CONFIRM),
        (State.DELAYED, Event.SESSION_LOST),
    ],
)
def test_illegal_events_are_refused_by_name(state: State, event: Event) -> None:
    with pytest.raises(IllegalTransition, match=event.value):
        apply(Message(state), event, 0.0, RULES)


def test_delivery_counts_and_is_exactly_max_deliveries_then_dead_once() -> None:
    message = Message(State.READY, accepted_at=0.0)
    pushes = 0
    while message.state is not State.DEAD:
        outcome = apply(message, Event.DELIVER, 1.0, RULES)
        message = outcome.message
        if outcome.row.effect is Effect.PUSH:
            pushes += 1
            assert message.delivery_count == pushes
            message = apply(message, Event.REQUEUE, 1.0, RULES).message
    assert pushes == 3
    assert message.reason == REASON_DELIVERY_LIMIT


def test_the_limit_is_reached_on_release_and_on_delivery_alike() -> None:
    held = Message(State.HELD, delivery_count=3)
    for event in (Event.REQUEUE, Event.SESSION_LOST, Event.NODE_LOST):
        after = apply(held, event, 0.0, RULES).message
        assert (after.state, after.reason) == (State.DEAD, REASON_DELIVERY_LIMIT)
    assert (
        apply(Message(State.HELD, delivery_count=2), Event.REQUEUE, 0.0, RULES).message.state
        is State.READY
    )
    ready = Message(State.READY, delivery_count=3)
    assert apply(ready, Event.DELIVER, 0.0, RULES).message.reason == REASON_DELIVERY_LIMIT
    assert (
        apply(Message(State.READY, delivery_count=2), Event.DELIVER, 0.0, RULES).message.state
        is State.HELD
    )


def test_ttl_counts_from_acceptance_and_never_expires_a_held_message() -> None:
    ready = Message(State.READY, accepted_at=100.0)
    assert apply(ready, Event.TICK, 109.999, RULES).message.state is State.READY
    assert apply(ready, Event.TICK, 110.0, RULES).message.reason == REASON_EXPIRED
    assert apply(ready, Event.DELIVER, 110.0, RULES).message.reason == REASON_EXPIRED
    assert apply(ready, Event.DELIVER, 109.0, RULES).message.state is State.HELD
    held = Message(State.HELD, delivery_count=1, accepted_at=100.0)
    assert apply(held, Event.TICK, 500.0, RULES).message.state is State.HELD
    assert apply(held, Event.PURGE, 500.0, RULES).message.state is State.HELD
    assert apply(held, Event.CONFIRM, 500.0, RULES).message.state is State.CONFIRMED
    released = apply(held, Event.SESSION_LOST, 500.0, RULES).message
    assert (released.state, released.reason) == (State.DEAD, REASON_EXPIRED)
    assert apply(held, Event.SESSION_LOST, 105.0, RULES).message.state is State.READY


def test_without_a_policy_nothing_expires_or_runs_out() -> None:
    none = Rules()
    held = Message(State.HELD, delivery_count=10**6, accepted_at=0.0)
    assert apply(held, Event.REQUEUE, 10**9, none).message.state is State.READY
    assert (
        apply(Message(State.READY, delivery_count=10**6), Event.DELIVER, 10**9, none).message.state
        is State.HELD
    )


def test_the_limit_wins_over_the_ttl_when_both_hold() -> None:
    held = Message(State.HELD, delivery_count=3, accepted_at=0.0)
    assert apply(held, Event.REQUEUE, 100.0, RULES).message.reason == REASON_DELIVERY_LIMIT
    assert release(3, 0.0, 100.0, RULES) == REASON_DELIVERY_LIMIT


def test_reject_delay_and_due() -> None:
    held = Message(State.HELD, delivery_count=1, accepted_at=0.0)
    assert apply(held, Event.REJECT, 0.0, RULES).message.reason == REASON_REJECTED
    delayed = apply(held, Event.DELAY, 0.0, RULES).message
    assert (delayed.state, delayed.delivery_count) == (State.DELAYED, 1)
    assert apply(delayed, Event.TICK, 50.0, RULES).message.state is State.DELAYED
    assert apply(delayed, Event.DUE, 5.0, RULES).message.state is State.READY
    assert apply(delayed, Event.DUE, 10.0, RULES).message.reason == REASON_EXPIRED
    assert apply(delayed, Event.PURGE, 1.0, RULES).message.state is State.PURGED
    assert apply(Message(State.READY), Event.PURGE, 1.0, RULES).message.state is State.PURGED


def test_pickup_deadline_applies_only_before_the_first_delivery() -> None:
    fresh = Message(State.READY, pickup_deadline=5.0)
    assert apply(fresh, Event.TICK, 4.9, Rules()).message.state is State.READY
    assert apply(fresh, Event.TICK, 5.0, Rules()).message.reason == REASON_EXPIRED
    seen = Message(State.READY, delivery_count=1, pickup_deadline=5.0)
    assert apply(seen, Event.TICK, 50.0, Rules()).message.state is State.READY
    assert not pickup_missed(0, None, 1e9)


@pytest.mark.parametrize("count", range(6))
@pytest.mark.parametrize("age", [0.0, 9.99, 10.0, 11.0])
def test_the_hot_path_deciders_agree_with_the_table(count: int, age: float) -> None:
    for event in RELEASES:
        state = State.DELAYED if event is Event.DUE else State.HELD
        after = apply(Message(state, delivery_count=count, accepted_at=0.0), event, age, RULES)
        expected = None if after.message.state is State.READY else after.message.reason
        assert release(count, 0.0, age, RULES) == expected
    after = apply(Message(State.READY, delivery_count=count), Event.DELIVER, age, RULES)
    expected = None if after.message.state is State.HELD else after.message.reason
    assert before_delivery(count, 0.0, age, RULES) == expected


def test_guards_at_their_edges() -> None:
    assert not spent(2, 3) and spent(3, 3) and spent(4, 3) and not spent(10**9, None)
    assert (
        not expired(0.0, 9.999, 10.0) and expired(0.0, 10.0, 10.0) and not expired(0.0, 1e9, None)
    )


@pytest.mark.parametrize(
    ("known", "age", "queue_full", "history_full", "expected"),
    [
        (7, 10**9, True, True, Admission.DUPLICATE),
        (8, 0, False, False, Admission.CONFLICT),
        (None, 301_000, True, True, Admission.TOO_OLD),
        (None, 300_000, True, True, Admission.QUEUE_FULL),
        (None, 0, False, True, Admission.HISTORY_FULL),
        (None, 0, False, False, Admission.ACCEPT),
    ],
)
def test_admission_order(
    known: int | None, age: int, queue_full: bool, history_full: bool, expected: Admission
) -> None:
    assert admit(known, 7, age, 300_000, queue_full, history_full) is expected


def test_the_docs_show_the_table_as_the_code_has_it() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "lifecycle.md").read_text()
    shown = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in doc.splitlines()
        if line.startswith("| ") and not line.startswith("| state")
    ]
    assert shown == [
        [
            r.state.value,
            r.event.value,
            r.guard.value,
            r.target.value,
            r.effect.value,
            r.reason or "",
        ]
        for r in TRANSITIONS
    ]


def test_a_staged_row_is_discarded_once_its_deadline_has_come() -> None:
    staged = Message(State.STAGED, stage_deadline=5.0)
    assert apply(staged, Event.TICK, 4.9, Rules()).message.state is State.STAGED
    assert apply(staged, Event.TICK, 5.0, Rules()).message.state is State.DISCARDED
    assert apply(staged, Event.TICK, 50.0, Rules()).message.state is State.DISCARDED
    assert apply(Message(State.STAGED), Event.TICK, 1e9, Rules()).message.state is State.STAGED
    assert stage_expired(5.0, 5.0) and stage_expired(5.0, 6.0)
    assert not stage_expired(5.0, 4.9) and not stage_expired(None, 1e9)


def test_a_pickup_deadline_well_past_is_missed_too() -> None:
    assert pickup_missed(0, 5.0, 5.5) and pickup_missed(0, 5.0, 5.0)
    assert not pickup_missed(0, 5.0, 4.5)


def test_admission_compares_real_64_bit_digests_by_value() -> None:
    big = int("7" * 18)  # made at run time: not a cached int object
    same = int("7" * 18)
    assert admit(big, same, 0, 300_000, False, False) is Admission.DUPLICATE
    assert admit(big - 1, big, 0, 300_000, False, False) is Admission.CONFLICT
    assert admit(big + 1, big, 0, 300_000, False, False) is Admission.CONFLICT


def test_the_table_and_its_records_cannot_change_in_place() -> None:
    """Rows, rules, messages and outcomes are values: ``apply`` returns new ones, and
    nobody can edit the table a store runs."""
    outcome = apply(Message(State.READY), Event.DELIVER, 0.0, Rules())
    for record, field in (
        (TRANSITIONS[0], "target"),
        (Rules(), "ttl"),
        (outcome.message, "state"),
        (outcome, "row"),
    ):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, None)
