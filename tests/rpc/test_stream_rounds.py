"""Rounds of a data stream, sans I/O (``holdfast.sdk.rpc.chunks``, "Rounds"): a reader
of a redelivered request asks for the stream again, and the sender starts it over
(rewound, or from its copy of the first chunks) or fails it in the new round; readers
keep to their round. No broker: ``test_stream_worker_lost.py`` runs it end to end."""

from __future__ import annotations

import uuid

import pytest

from holdfast.sdk import StreamError
from holdfast.sdk.rpc import chunks
from holdfast.sdk.rpc.incoming import Incoming, Verdict
from holdfast.sdk.rpc.outgoing import Outgoing, rewind, rewind_point
from holdfast.sdk.types import Message

settled: list[uuid.UUID] = []


def delivered(chunk: chunks.Chunk, count: int = 1) -> Message:
    """``chunk`` as a reader gets it; its confirm is noted in ``settled``."""
    return Message(chunk.guid, chunk.payload, chunk.properties, count, "hf://t/q", _note, 1, 1)


def _note(message: Message, reject: object = None) -> None:
    settled.append(message.guid)


def send_all(out: Outgoing, pieces: list[bytes]) -> list[chunks.Chunk]:
    """The chunks of ``pieces`` and the end, as the sender makes them."""
    return [out.data(piece) for piece in [*pieces, b""]]


def read_all(reader: Incoming, sent: list[chunks.Chunk]) -> bytes:
    """What ``reader`` reads of ``sent``, delivered in order."""
    data = b""
    for chunk in sent:
        message = reader.take(delivered(chunk))
        if message is not None:
            reader.accept(message)
            data += reader.read_buffered(len(message.payload))
    return data


def test_round_zero_is_the_wire_of_old_and_each_round_has_guids_of_its_own() -> None:
    guid = uuid.uuid4()
    assert chunks.chunk_guid(guid, "d", 3, 0) == chunks.chunk_guid(guid, "d", 3)
    assert chunks.credit_guid(guid, "d", 7, epoch=0) == chunks.credit_guid(guid, "d", 7)
    made = {
        chunks.chunk_guid(guid, "d", 3),
        chunks.chunk_guid(guid, "d", 3, 1),
        chunks.chunk_guid(guid, "d", 3, 2),
        chunks.credit_guid(guid, "d", 3),
        chunks.credit_guid(guid, "d", 3, epoch=1),
        chunks.credit_guid(guid, "d", 3, stop=True, epoch=1),
        chunks.restart_guid(guid, "d", 1),
        chunks.restart_guid(guid, "d", 2),
    }
    assert len(made) == 8
    out = Outgoing(guid, "d")
    assert chunks.EPOCH not in out.data(b"x").properties
    # A first delivery's reader reads round 0; each redelivery's, one more.
    assert [chunks.round_of(count) for count in (1, 2, 5)] == [0, 1, 4]


def test_a_new_readers_restart_begins_a_round_from_the_rewound_source() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "d")
    first = send_all(out, [b"a", b"b"])
    reader = Incoming(guid, "d", epoch=1)
    restart = reader.restart()
    assert restart is not None and reader.restart() is None  # asked once
    assert restart.properties[chunks.RESTART] == "1" and chunks.epoch_of(restart.properties) == 1
    assert not out.restart_wanted
    out.on_credit(restart.properties)
    assert out.restart_wanted
    assert out.restart(rewound=True) is None
    assert not out.restart_wanted and out.epoch == 1 and out.replayed() is None
    again = send_all(out, [b"a", b"b"])
    assert [c.properties[chunks.SEQ] for c in again] == ["0", "1", "2"]
    assert all(c.properties[chunks.EPOCH] == "1" for c in again)
    assert {c.guid for c in again}.isdisjoint({c.guid for c in first})
    # The lost reader's chunks still in the queue come first: skipped and confirmed.
    settled.clear()
    assert read_all(reader, [*first, *again]) == b"ab" and reader.done
    assert settled[:3] == [c.guid for c in first]


def test_a_rewound_round_starts_no_copy_where_none_was_kept() -> None:
    out = Outgoing(uuid.uuid4(), "d")  # a seekable source: no copy
    out.data(b"a")
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "1", chunks.RESTART: "1"})
    assert out.restart(rewound=True) is None
    out.data(b"a")
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "2", chunks.RESTART: "1"})
    assert isinstance(out.restart(rewound=False), StreamError)  # a rewind that failed
    kept = Outgoing(uuid.uuid4(), "d", keep=True)
    kept.data(b"old")
    kept.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "1", chunks.RESTART: "1"})
    assert kept.restart(rewound=True) is None and kept.replayed() is None
    kept.data(b"new")  # the copy starts again with the rewound round
    kept.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "2", chunks.RESTART: "1"})
    assert kept.restart(rewound=False) is None and kept.replayed() == b"new"


def test_credits_count_only_in_the_round_being_sent() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "d")
    send_all(out, [b"x"] * 17)  # past the window: only credit lets more go
    newer = Incoming(guid, "d", epoch=1)
    restart = newer.restart()
    assert restart is not None
    out.on_credit(restart.properties)
    out.restart(rewound=True)
    for _ in range(chunks.CREDIT_WINDOW - 1):  # a round's window is the first one's
        out.data(b"y")
    assert out.may_send
    out.data(b"y")
    assert not out.may_send
    # The lost reader's late credit (round 0) gives nothing, nor does its stop, nor a
    # credit of a round not begun.
    out.on_credit({chunks.CREDIT: "30"})
    out.on_credit({chunks.CREDIT: "30", chunks.CREDIT_STOP: "1"})
    out.on_credit({chunks.CREDIT: "30", chunks.EPOCH: "2"})
    assert not out.may_send and not out.reader_stopped
    out.on_credit({chunks.CREDIT: "7", chunks.EPOCH: "1"})
    assert out.may_send
    # A restart asking for a round already begun, or an earlier one, is no news.
    out.on_credit(restart.properties)
    out.on_credit({chunks.CREDIT: "-1", chunks.RESTART: "1"})
    assert not out.restart_wanted


def test_a_source_that_cannot_seek_is_sent_again_from_the_copy_of_its_first_chunks() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "d", keep=True)
    pieces = [bytes([n]) * 3 for n in range(chunks.CREDIT_WINDOW)]  # the whole copy, and the end
    send_all(out, pieces)
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "1", chunks.RESTART: "1"})
    assert out.restart(rewound=False) is None
    replayed = []
    while (data := out.replayed()) is not None:
        replayed.append(data)
        chunk = out.data(data)
        assert chunk.properties[chunks.EPOCH] == "1"
    assert replayed == [*pieces, b""]
    # A second round needs the copy again: it is still whole.
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "2", chunks.RESTART: "1"})
    assert out.restart(rewound=False) is None and out.replayed() == pieces[0]


def test_a_copy_stops_at_the_window_and_the_source_goes_on_after_it() -> None:
    out = Outgoing(uuid.uuid4(), "d", keep=True)
    for n in range(3):
        out.data(bytes([n]))
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "1", chunks.RESTART: "1"})
    assert out.restart(rewound=False) is None
    assert [out.replayed() for _ in range(4)] == [b"\x00", b"\x01", b"\x02", None]
    # (the front-end posts those three, then reads the source from where it was)
    for n in range(3):
        out.data(bytes([n]))
    for n in range(3, chunks.CREDIT_WINDOW + 1):
        out.data(bytes([n]))  # the 17th chunk passes the copy: it is dropped
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "2", chunks.RESTART: "1"})
    error = out.restart(rewound=False)
    assert isinstance(error, StreamError) and "seekable" in str(error)


def test_a_round_that_cannot_begin_fails_the_new_reader_in_its_round() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "d")  # no copy, not rewound
    send_all(out, [b"a"])
    reader = Incoming(guid, "d", epoch=1)
    restart = reader.restart()
    assert restart is not None
    out.on_credit(restart.properties)
    error = out.restart(rewound=False)
    assert error is not None
    abort, raised = out.failed(error)
    assert raised is error and abort.properties[chunks.ABORT] == "StreamError"
    message = reader.take(delivered(abort))
    assert message is not None
    with pytest.raises(StreamError, match="cannot be read again"):
        reader.accept(message)


def test_a_reader_gives_up_at_a_later_rounds_chunk_and_leaves_it_unconfirmed() -> None:
    guid = uuid.uuid4()
    older = Incoming(guid, "d")
    out = Outgoing(guid, "d")
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "2", chunks.RESTART: "1"})
    out.restart(rewound=True)
    later = out.data(b"new")
    assert older.offer(delivered(later)) is Verdict.LATER
    settled.clear()
    with pytest.raises(StreamError, match="another worker"):
        older.take(delivered(later))
    assert settled == [] and older.done
    # A chunk whose round cannot be read is no chunk of any round: skipped.
    odd = chunks.Chunk(b"", {chunks.SEQ: "0", chunks.EPOCH: "x"}, uuid.uuid4())
    assert Incoming(guid, "d").offer(delivered(odd)) is Verdict.DROP


def test_a_later_rounds_credits_name_their_round() -> None:
    guid = uuid.uuid4()
    out = Outgoing(guid, "d")
    reader = Incoming(guid, "d", epoch=1)
    out.on_credit({chunks.CREDIT: "-1", chunks.EPOCH: "1", chunks.RESTART: "1"})
    out.restart(rewound=True)
    sent = [out.data(bytes(10)) for _ in range(chunks.CREDIT_EVERY)]
    read_all(reader, sent[:-1])
    assert reader.credit() is None
    read_all(reader, sent[-1:])
    credit = reader.credit()
    assert credit is not None
    assert credit.properties[chunks.EPOCH] == "1"
    assert credit.guid == chunks.credit_guid(guid, "d", chunks.CREDIT_EVERY - 1, epoch=1)
    stop = reader.last_credit()
    assert stop is not None and stop.properties[chunks.EPOCH] == "1"


def test_rewinding_needs_a_source_that_seeks() -> None:
    import io

    source = io.BytesIO(b"0123456789")
    source.read(2)
    start = rewind_point(source)
    assert start == 2
    source.read(5)
    assert rewind(source, start) and source.read() == b"23456789"

    class Unseekable:
        def read(self, size: int = -1) -> bytes:
            return b""

    assert rewind_point(Unseekable()) is None and not rewind(Unseekable(), 0)

    class Liar(io.RawIOBase):
        def seekable(self) -> bool:
            return True

        def tell(self) -> int:
            raise OSError("no")

    assert rewind_point(Liar()) is None

    class StuckSeek(io.BytesIO):
        def seek(self, offset: int, whence: int = 0, /) -> int:
            raise OSError("the tape is stuck")

    stuck = StuckSeek(b"abc")
    assert rewind_point(stuck) == 0 and not rewind(stuck, 0)


def test_rounds_past_the_small_integers_are_still_told_apart_by_value() -> None:
    # Rounds are delivery counts: a request redelivered many times has a large one.
    guid = uuid.uuid4()
    out = Outgoing(guid, "d")
    reader = Incoming(guid, "d", epoch=1000)
    restart = reader.restart()
    assert restart is not None
    out.on_credit(restart.properties)
    assert out.restart(rewound=True) is None and out.epoch == 1000
    sent = [out.data(bytes(8)) for _ in range(chunks.CREDIT_EVERY)]
    assert read_all(reader, sent) == bytes(8 * chunks.CREDIT_EVERY)
    credit = reader.credit()
    assert credit is not None
    for _ in range(chunks.CREDIT_WINDOW - chunks.CREDIT_EVERY):
        out.data(b"z")
    assert not out.may_send
    out.on_credit(credit.properties)
    assert out.may_send
