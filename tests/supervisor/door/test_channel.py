"""The supervisor's side of the door process: the channel's messages (framed, bounded,
versioned) and the runners' seats, which tell the door process what happens and keep its last
word, so that a door process that dials the channel is told the whole state again."""

from __future__ import annotations

import asyncio

import pytest

from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.errors import ChannelClosed
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.supervisor.core.doorbook import EngineEnd, EngineReading
from cuzkd.supervisor.door.channel import (
    MAX_MESSAGE,
    Admit,
    Broken,
    EngineState,
    Figures,
    Gone,
    Reading,
    StopAdmitting,
    ToDoor,
    frame,
    read_from_door,
    read_to_door,
)
from cuzkd.supervisor.door.remote import RemoteSeat


def feed(*chunks: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    for chunk in chunks:
        reader.feed_data(chunk)
    reader.feed_eof()
    return reader


def test_messages_cross_the_channel_whole_and_an_oversized_or_odd_one_closes_it() -> None:
    async def main() -> None:
        reading = Reading("cz", ["porep-1-1"], [], {"porep-c2": (1, 0)}, "")
        assert await read_to_door(feed(frame(reading))) == reading
        metrics = DoorMetrics()
        metrics.refused("cz", "deadline", "winning-post")  # type: ignore[arg-type]
        figures = await read_from_door(feed(frame(Figures(metrics.snapshot()))))
        assert isinstance(figures, Figures)
        assert figures.doors["cz"].refusals == {"deadline\twinning-post": 1}
        with pytest.raises(ChannelClosed, match="over"):
            await read_to_door(feed((MAX_MESSAGE + 1).to_bytes(4, "big")))
        with pytest.raises(ChannelClosed, match="not a message"):
            await read_to_door(feed(b"\0\0\0\2{}"))
        with pytest.raises(ChannelClosed, match="closed"):
            await read_to_door(feed(frame(reading)[:7]))

    asyncio.run(main())


def test_a_reading_crosses_as_the_door_reads_it() -> None:
    reading = EngineReading(frozenset({"a", "b"}), frozenset({"a"}),
                            QueueReading({"porep-c2": KindQueue(2, 1)}))
    seat, sent = seat_and_outbox()
    seat.reading(reading)
    [message] = sent
    assert isinstance(message, Reading) and message.reading() == reading
    unknown = EngineReading(None, frozenset(), QueueReading.unknown("deadline exceeded"))
    seat.reading(unknown)
    assert isinstance(sent[-1], Reading) and sent[-1].reading() == unknown


def seat_and_outbox(now: list[float] | None = None) -> tuple[RemoteSeat, list[ToDoor]]:
    sent: list[ToDoor] = []
    clock = now if now is not None else [0.0]
    return RemoteSeat("cz", sent.append, lambda: clock[0]), sent


def test_the_seat_keeps_the_door_process_s_last_word_for_the_runner() -> None:
    seat, sent = seat_and_outbox()
    seat.admit("unix:///s/cz.grpc.sock", lambda why: None)
    assert sent == [Admit("cz", "unix:///s/cz.grpc.sock", 1)]
    assert (seat.in_flight(), seat.wants_reading()) == (0, False)
    seat.told(EngineState("cz", 3, True))
    assert (seat.in_flight(), seat.wants_reading()) == (3, True)
    seat.door_lost()  # its calls died with the door process's connections
    assert (seat.in_flight(), seat.wants_reading()) == (0, False)
    seat.gone(EngineEnd.CRASHED)
    seat.told(EngineState("cz", 2, False))  # of the process that ended: too late
    assert seat.in_flight() == 0 and sent[-1] == Gone("cz", "crashed", 1)


def test_broken_answers_reach_the_runner_once_and_only_for_its_process() -> None:
    seat, _ = seat_and_outbox()
    said: list[str] = []
    seat.admit("unix:///a", said.append)
    seat.broke(Broken("cz", 1, "not a cuzk.v1.ProveResponse"))
    seat.broke(Broken("cz", 1, "again"))
    assert said == ["not a cuzk.v1.ProveResponse"]
    seat.admit("unix:///a", said.append)
    seat.broke(Broken("cz", 1, "of the process before"))
    assert said == ["not a cuzk.v1.ProveResponse"]


def test_a_door_process_that_dials_is_told_the_engine_s_state_by_serial() -> None:
    """The last end, the admission and a stop with what is left of its drain, each naming the
    engine's process: the door process applies what it has not had."""
    now = [100.0]
    seat, _ = seat_and_outbox(now)
    assert seat.replay() == []  # never admitted: nothing to tell
    seat.admit("unix:///a", lambda why: None)
    assert seat.replay() == [Admit("cz", "unix:///a", 1)]
    seat.stop_admitting(20.0)
    now[0] = 112.0
    assert seat.replay() == [Admit("cz", "unix:///a", 1), StopAdmitting("cz", 8.0, 1)]
    seat.stop_admitting(None)
    assert seat.replay()[-1] == StopAdmitting("cz", None, 1)
    seat.gone(EngineEnd.DRAINED)
    assert seat.replay() == [Gone("cz", "drained", 1)]
    seat.admit("unix:///a", lambda why: None)
    assert seat.replay() == [Gone("cz", "drained", 1), Admit("cz", "unix:///a", 2)]
