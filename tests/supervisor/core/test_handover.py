"""The hand-over of ``cuzkd upgrade``: what the old code writes, the new code reads back whole;
another format, or bytes that are no hand-over, are refused with a reason that says so."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzkd.errors import HandoverRefused
from cuzkd.metrics.carry import CarriedSample
from cuzkd.metrics.door_metrics import DoorFigures
from cuzkd.metrics.door_metrics import Histogram as DoorHistogram
from cuzkd.states import State
from cuzkd.supervisor.core.handover import (
    FORMAT,
    Child,
    DoorHandover,
    EngineHandover,
    Handover,
    LifecycleState,
    Listeners,
    Locks,
    SeatState,
    decode,
    encode,
)

fds = st.integers(min_value=0, max_value=65535)
text = st.text(max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False)
maybe_time = st.none() | finite
counts = st.dictionaries(text, st.integers(min_value=0, max_value=1 << 53), max_size=4)

children = st.builds(Child, pid=st.integers(min_value=1, max_value=1 << 22), stdout=fds,
                     stderr=fds)
lifecycles = st.builds(
    LifecycleState, state=st.sampled_from([s.value for s in State]),
    pid=st.none() | st.integers(min_value=1), spawned_at=maybe_time, healthy_since=maybe_time,
    last_ok=maybe_time, next_start_at=maybe_time, restarts=st.integers(min_value=0),
    exits=counts, last_exit_cause=st.none() | text, last_error=st.none() | text,
    first_answer_seconds=maybe_time, started_once=st.booleans(),
    exit_unexplained=st.booleans(), backoff_failures=st.integers(min_value=0, max_value=64))
engines = st.builds(EngineHandover, name=text, lifecycle=lifecycles,
                    process=st.none() | children, started_at=maybe_time,
                    admitted=st.booleans())
histograms = st.builds(DoorHistogram, counts=st.lists(st.integers(min_value=0), max_size=5),
                       sum=finite)
figures = st.builds(DoorFigures, engines=st.lists(text, max_size=3),
                    held=st.integers(min_value=0), proofs=counts, retries=counts,
                    timings=st.dictionaries(text, st.lists(histograms, max_size=2), max_size=2),
                    holds=st.dictionaries(text, histograms, max_size=2))
seats = st.builds(SeatState, address=st.none() | text, serial=st.integers(min_value=0),
                  last_gone=st.none() | st.tuples(text, st.integers(min_value=0)))
doors = st.builds(DoorHandover, channel_version=st.integers(min_value=1, max_value=9),
                  sockets=st.dictionaries(text, fds, max_size=3), channel=fds,
                  process=st.none() | children, ran_for=finite, ready=st.booleans(),
                  restarts=st.integers(min_value=0), exits=counts,
                  ended=st.dictionaries(text, figures, max_size=2),
                  seats=st.dictionaries(text, seats, max_size=3))
samples = st.builds(CarriedSample, family=text, name=text,
                    labels=st.dictionaries(text, text, max_size=3),
                    value=st.floats(min_value=0, allow_nan=False, allow_infinity=False))
handovers = st.builds(
    Handover, format=st.just(FORMAT), version=text, upgrade_id=text,
    config_text=st.none() | st.text(max_size=400), config_path=st.none() | text,
    demo=st.booleans(), signal_mask=st.lists(st.integers(min_value=1, max_value=64)),
    handed_at=finite, frozen_seconds=finite, freezes=st.integers(min_value=0),
    started_at=finite, reload_ok=st.booleans(), reload_success_at=finite,
    locks=st.builds(Locks, state_dir=fds, control_socket=fds),
    listeners=st.builds(Listeners, control=fds, metrics=st.lists(fds, max_size=3)),
    engines=st.lists(engines, max_size=4), door=st.none() | doors,
    samples=st.lists(samples, max_size=6))


@settings(max_examples=200, deadline=None)
@given(handovers)
def test_a_handover_reads_back_as_it_was_written(handover: Handover) -> None:
    assert decode(encode(handover)) == handover


@settings(max_examples=100, deadline=None)
@given(handovers)
def test_every_descriptor_it_names_is_kept_across_the_exec(handover: Handover) -> None:
    kept = handover.descriptors()
    named = [handover.locks.state_dir, handover.locks.control_socket,
             handover.listeners.control, *handover.listeners.metrics]
    processes = [e.process for e in handover.engines]
    if handover.door is not None:
        named += [*handover.door.sockets.values(), handover.door.channel]
        processes.append(handover.door.process)
    named += [fd for p in processes if p is not None for fd in (p.stdout, p.stderr)]
    assert sorted(kept) == sorted(named)


def _minimal(**fields: object) -> Handover:
    base = Handover(format=FORMAT, version="1.0.0", upgrade_id="u1", config_text=None,
                    config_path=None, demo=False, signal_mask=[], handed_at=1.0,
                    frozen_seconds=0.0, freezes=0, started_at=1.0, reload_ok=True,
                    reload_success_at=1.0, locks=Locks(3, 4), listeners=Listeners(5, [6]),
                    engines=[], door=None, samples=[])
    return msgspec.structs.replace(base, **fields)


def test_another_format_is_refused_naming_both_and_the_way_out() -> None:
    data = msgspec.json.encode({**msgspec.to_builtins(_minimal()), "format": FORMAT + 1,
                                "something_new": [1, 2]})
    with pytest.raises(HandoverRefused) as refused:
        decode(data)
    message = str(refused.value)
    assert f"hand-over format {FORMAT + 1} from cuzkd 1.0.0" in message
    assert f"reads format {FORMAT} only" in message and "restart" in message


@pytest.mark.parametrize("data", [b"", b"\x00\xff", b"[1, 2]", b'{"version": "1"}'])
def test_bytes_that_are_no_handover_are_refused(data: bytes) -> None:
    with pytest.raises(HandoverRefused, match="not a cuzkd hand-over"):
        decode(data)


def test_a_handover_of_this_format_missing_a_field_is_refused_not_misread() -> None:
    whole = msgspec.to_builtins(_minimal())
    del whole["locks"]
    with pytest.raises(HandoverRefused, match="does not decode"):
        decode(msgspec.json.encode(whole))
