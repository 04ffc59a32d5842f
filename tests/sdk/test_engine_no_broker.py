"""``SessionEngine.no_broker`` (issue #34, a table event since #29) scripted without
sockets: a proxy that reaches no broker refused the connection that just ended."""

from __future__ import annotations

import pytest

from holdfast.sdk.engine import LinkState
from holdfast.sdk.errors import BrokerUnreachableError, LocalProtocolError
from holdfast.sdk.state import LINK_TRANSITIONS, LinkEvent

from .fakes import URI, Harness, opens_in

OTHER = "hf://test/invoices"


def test_no_broker_is_an_input_of_the_link_table_only_while_disconnected() -> None:
    legal = {state for state, row in LINK_TRANSITIONS.items() if LinkEvent.NO_BROKER in row}
    assert legal == {LinkState.DISCONNECTED}
    assert LINK_TRANSITIONS[LinkState.DISCONNECTED][LinkEvent.NO_BROKER] is LinkState.DISCONNECTED


def test_first_opens_fail_now_and_open_queues_wait_for_their_reopen() -> None:
    h = Harness()
    h.establish()
    opened = h.open_active(URI)
    h.lose()
    _, first_open = h.open_queue(OTHER)

    h.connect()
    h.lose("refused")
    h.engine.no_broker("proxy-a:7700: no broker")
    h.run_callbacks()

    (error,) = h.outcomes(first_open)
    assert isinstance(error, BrokerUnreachableError)
    assert "proxy-a:7700: no broker" in str(error)
    assert h.state() is LinkState.DISCONNECTED
    h.establish()
    assert h.engine.queue(opened) is not None


def test_no_broker_on_a_live_connection_is_a_shell_bug() -> None:
    h = Harness()
    h.connect()
    with pytest.raises(LocalProtocolError, match="no_broker"):
        h.engine.no_broker("refused")


def test_no_broker_after_the_session_ended_is_ignored() -> None:
    h = Harness()
    h.engine.close()
    h.engine.no_broker("refused")
    assert h.state() is LinkState.CLOSED


def test_the_reopen_after_no_broker_leaves_the_failed_open_out() -> None:
    h = Harness()
    h.open_queue(URI)
    h.connect()
    h.lose("refused")
    h.engine.no_broker("no broker")
    h.connect()
    h.answer_hello()
    assert opens_in(h.sent_frames()) == []
