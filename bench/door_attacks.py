"""Hostile callers at the front door, and the honest caller beside them, for any checkout.

    PYTHONPATH=CHECKOUT CHECKOUT/.venv/bin/python bench/door_attacks.py --checkout CHECKOUT \\
        [--label before] [--only rapid_reset metadata ...] [--seconds 15] [--json OUT]
    python bench/door_attacks.py --merge before.json after.json   # the tables side by side

Each scenario starts a fresh ``cuzkd run`` (``sys.executable -m cuzkd run``, PYTHONPATH the
checkout) supervising the checkout's cuzk stand-in (``tests/support/cuzk_standin.py``) as a
``type = "cuzk"`` engine behind a door at the stand-in TOML's ``[daemon] listen`` (a Unix socket,
or ``127.0.0.1:PORT`` with ``--tcp``), the address Curio dials. Default knobs but
``CUZK_STANDIN_SYNTH_SECS=0.05``, ``CUZK_STANDIN_GPU_SECS=0.01`` (a PoRep C2 in ~0.1 s); each
``GetStatus`` burns the stand-in's 30 ms of CPU (cuzk's ``nvidia-smi``); cuzkd's defaults
(``health_interval`` 1 s, ``unhealthy_after`` 15 s, the door's default bounds).

- **The honest caller** (a process of its own, so the attacker's CPU does not slow its loop):
  one grpc.aio channel (one connection), a ``GetStatus`` every second (5 s deadline) and a
  ``Prove`` of a PoRep C2 carrying 1 MB every 2 s (60 s deadline), from ``--warm`` seconds
  before the attack. Counted: the calls sent while the attack ran; any non-OK code is a
  failure, a ``Prove`` whose reply is not COMPLETED (or that is still unanswered
  ``--grace`` seconds after the attack) a proof lost. Apart from it, every 2 s a ``GetStatus``
  on a new connection of its own (a Curio that reconnects).
- **Attackers** (raw HTTP/2 written frame by frame here, so a Python client floods at a rate
  near a compiled one's; frames of the server answered: SETTINGS and PING acknowledged):
  ``rapid_reset`` (HEADERS + RST_STREAM flat out on 2 connections, a new connection whenever
  one is closed), ``metadata`` (complete ``GetStatus`` calls with 7 KiB of metadata flat out
  on 2 connections, as many in flight as the server allows, at most 1000), ``prove_flood``
  (3,000 ``Prove`` on one connection, sent before the server's SETTINGS are read, their ids
  among the stand-in's ``CUZK_STANDIN_NEVER_ANSWER``: an engine that never answers),
  ``prove_flood_24`` (the same 3,072 spread over 24 connections of 128, within the bound a
  server advertises), ``big_requests`` (24 streams on one connection each announcing a
  127 MiB ``Prove`` in gRPC's prefix and sending 40 MiB of it as flow control allows, then
  silent), ``window_zero`` (4 connections with ``INITIAL_WINDOW_SIZE`` 0 each opening
  ``GetStatus`` calls, as many as the server allows, at most 1000: the stand-in's replies are
  a few hundred bytes, so it is their number, not their size), ``silent`` (300 connections
  that never send HTTP/2's preface, cuzkd under a descriptor limit of 256), ``long_id`` (one
  ``Prove`` whose request_id is 17 MiB), ``padded`` (whole, valid calls flat out on 2
  connections: 120 MiB ``SubmitProof``s one after another and ``GetStatus`` requests padded
  to 4 MiB), ``shared_slow`` (no attacker: two engines behind one
  door, one of which burns 5 s of CPU per ``GetStatus``; ``shared`` is the same with both
  well).
- **Measured**: the supervisor's (the ``cuzkd run`` process's) peak RSS, CPU and descriptors
  (``/proc``, every 0.2 s), the door process's peak RSS and CPU (where there is one: a child
  of cuzkd running ``cuzkd.supervisor.door.process``), the engines' CPU, engine restarts
  (``engine_exited`` events and engine pids), the control API's and ``/metrics``'s slowest
  answers (a ``GET /v1/supervisor`` and a scrape every second, 3 s timeout: "unresponsive" if
  none came), what the attacker saw, and the door's ``cuzkd_door_bounds_hit_total``.

Every scenario is bounded: the attack ends after ``--seconds``, the honest caller ``--grace``
seconds later, then cuzkd gets SIGTERM and, 20 s on, SIGKILL for its process group and every
descendant seen. Figures: docs/benchmarks.md (*The door stands apart*).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hpack

MIB = 1 << 20
SERVICE = "/cuzk.v1.ProvingEngine/"
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.05", "CUZK_STANDIN_GPU_SECS": "0.01",
         "GRPC_VERBOSITY": "NONE"}


# -- HTTP/2 frame by frame ---------------------------------------------------------------------

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 3, 4, 5
CANCEL = 8
DEFAULT_WINDOW = 65535


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack("!I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(
        "!I", stream) + payload


def _hpack_int(value: int, prefix: int) -> bytes:
    top = (1 << prefix) - 1
    if value < top:
        return bytes((value,))
    out, value = bytearray((top,)), value - top
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def header_block(method: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """gRPC's request headers for ``method``, every field a literal without indexing (new
    name): the block changes no HPACK table, so the same bytes serve every stream."""
    fields = ((":method", "POST"), (":scheme", "http"), (":path", SERVICE + method),
              (":authority", "localhost"), ("content-type", "application/grpc"),
              ("te", "trailers"), *extra)
    out = bytearray()
    for name, value in fields:
        out += b"\x00" + _hpack_int(len(name), 7) + name.encode()
        out += _hpack_int(len(value), 7) + value.encode()
    return bytes(out)


def grpc_message(body: bytes, declared: int | None = None) -> bytes:
    """``body`` behind gRPC's 5-byte prefix (``declared``: the length it claims)."""
    return struct.pack("!BI", 0, len(body) if declared is None else declared) + body


async def connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if address.startswith("unix:"):
        return await asyncio.open_unix_connection("/" + address.removeprefix("unix:").lstrip("/"))
    host, _, port = address.rpartition(":")
    return await asyncio.open_connection(host, int(port))


class Raw:
    """One client connection spoken frame by frame: the server's SETTINGS and PINGs
    acknowledged, its windows tracked, what it ends and resets counted. ``window``: this
    client's INITIAL_WINDOW_SIZE; ``reads``: whether it opens its windows for what it gets."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 window: int = DEFAULT_WINDOW, reads: bool = True) -> None:
        self._reader, self._writer = reader, writer
        self.reads = reads
        self.next_stream = 1
        self.conn_window = DEFAULT_WINDOW
        self.initial_window = DEFAULT_WINDOW
        self.max_frame = 16384
        self.max_streams: int | None = None
        self.stream_window: dict[int, int] = {}
        self.open: set[int] = set()
        self.answered = 0  # streams the server ended
        self.replies_started = 0  # response HEADERS without END_STREAM
        self.resets: Counter[int] = Counter()  # RST_STREAM from the server, by error code
        self.statuses: Counter[str] = Counter()  # the grpc-status of each call it ended
        self._hpack = hpack.Decoder()
        self._block = bytearray()  # a header block being received (CONTINUATION)
        self._block_flags = 0
        self.goaway: int | None = None
        self.closed = False
        self.settings_seen = asyncio.Event()
        self._changed = asyncio.Event()
        settings = struct.pack("!HI", 2, 0) + struct.pack("!HI", INITIAL_WINDOW_SIZE, window)
        hello = PREFACE + frame(SETTINGS, 0, 0, settings)
        if reads:
            hello += frame(WINDOW_UPDATE, 0, 0, struct.pack("!I", 64 * MIB))
        writer.write(hello)
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, address: str, **keys: Any) -> Raw:
        reader, writer = await connect(address)
        return cls(reader, writer, **keys)

    def write(self, data: bytes) -> None:
        if not self._writer.is_closing():
            self._writer.write(data)

    def unsent(self) -> int:
        """Bytes written here that the kernel has not taken yet."""
        return self._writer.transport.get_write_buffer_size()

    async def drain(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._writer.drain(), max(0.01, timeout))
        except ConnectionError:
            self.closed = True
        except TimeoutError:
            pass

    def headers(self, block: bytes, *, end: bool = False, track: bool = True) -> tuple[int,
                                                                                        bytes]:
        """A new stream's HEADERS frame (not written): (its id, the frame)."""
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        if track:
            self.open.add(stream)
            self.stream_window[stream] = self.initial_window
        return stream, frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), stream, block)

    def room(self, stream: int) -> int:
        return min(self.conn_window, self.stream_window.get(stream, 0))

    def data(self, stream: int, payload: bytes | memoryview, *, end: bool = False) -> bytes:
        """A DATA frame within the windows (the caller checked :meth:`room`)."""
        self.conn_window -= len(payload)
        if stream in self.stream_window:
            self.stream_window[stream] -= len(payload)
        return frame(DATA, END_STREAM if end else 0, stream, bytes(payload))

    async def changed(self, timeout: float) -> None:
        """Until the server sent anything that may change what can be sent, or ``timeout``."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), max(0.01, timeout))

    def close(self) -> None:
        self._task.cancel()
        self._writer.close()

    def _end(self, stream: int) -> None:
        if stream in self.open:
            self.open.discard(stream)
            self.stream_window.pop(stream, None)
            self.answered += 1

    async def _read(self) -> None:
        try:
            while True:
                head = await self._reader.readexactly(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags = head[3], head[4]
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = await self._reader.readexactly(length) if length else b""
                self._frame(kind, flags, stream, payload)
                self._changed.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed = True
            self._changed.set()

    def _headers(self, stream: int, flags: int, block: bytes) -> None:
        """A whole header block: every one decoded (HPACK's table is the connection's)."""
        fields = dict(self._hpack.decode(block, raw=True))
        status = fields.get(b"grpc-status")
        if status is not None:
            self.statuses[GRPC_CODES.get(status, status.decode())] += 1
        if flags & END_STREAM:
            self._end(stream)
        else:
            self.replies_started += 1

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            for i in range(0, len(payload) - 5, 6):
                key, value = struct.unpack("!HI", payload[i:i + 6])
                if key == MAX_CONCURRENT_STREAMS:
                    self.max_streams = value
                elif key == INITIAL_WINDOW_SIZE:
                    delta, self.initial_window = value - self.initial_window, value
                    for s in self.stream_window:
                        self.stream_window[s] += delta
                elif key == MAX_FRAME_SIZE:
                    self.max_frame = value
            self.write(frame(SETTINGS, ACK, 0))
            self.settings_seen.set()
        elif kind == PING and not flags & ACK:
            self.write(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = struct.unpack("!I", payload)[0] & 0x7FFFFFFF
            if stream == 0:
                self.conn_window += increment
            elif stream in self.stream_window:
                self.stream_window[stream] += increment
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                if flags & PADDED:
                    payload = payload[1:len(payload) - payload[0]]
                if flags & PRIORITY:
                    payload = payload[5:]
                self._block_flags = flags
                self._block.clear()
            self._block += payload
            if flags & END_HEADERS:
                self._headers(stream, self._block_flags, bytes(self._block))
        elif kind == DATA:
            if self.reads and payload:
                update = struct.pack("!I", len(payload))
                self.write(frame(WINDOW_UPDATE, 0, 0, update)
                           + frame(WINDOW_UPDATE, 0, stream, update))
            if flags & END_STREAM:
                self._end(stream)
        elif kind == RST_STREAM:
            self.resets[struct.unpack("!I", payload)[0]] += 1
            self._end(stream)
        elif kind == GOAWAY:
            self.goaway = struct.unpack("!II", payload[:8])[1]


ERRORS = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
          5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR", 7: "REFUSED_STREAM", 8: "CANCEL",
          11: "ENHANCE_YOUR_CALM"}


GRPC_CODES = {str(i).encode(): name for i, name in enumerate((
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED"))}


def closed_tally(raws: list[Raw]) -> tuple[int, int, Counter[int], Counter[str]]:
    """The attack's connections closed; before that, the streams they held open, how many
    the server closed, its stream resets by code and the calls' ends by grpc-status."""
    held = sum(len(r.open) for r in raws if not r.closed)
    closed = sum(r.closed for r in raws)
    resets: Counter[int] = sum((r.resets for r in raws), Counter())
    statuses: Counter[str] = sum((r.statuses for r in raws), Counter())
    for r in raws:
        r.close()
    return held, closed, resets, statuses


def error_names(codes: Counter[int]) -> str:
    return ", ".join(f"{ERRORS.get(c, c)} {n}" for c, n in codes.most_common()) or "none"


def code_names(codes: Counter[str]) -> str:
    return ", ".join(f"{c} {n}" for c, n in codes.most_common()) or "none"


# -- requests ------------------------------------------------------------------------------------

def prove_bytes(request_id: str, payload: bytes = b"") -> bytes:
    """A ``Prove`` of a PoRep C2 (NORMAL), ``payload`` as its C1 output."""
    from cuzkd.cuzk import proving_pb2 as pb

    return pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id=request_id, proof_kind=pb.POREP_SEAL_COMMIT, priority=pb.NORMAL,
        sector_size=32 << 30, vanilla_proof=payload)).SerializeToString()


# -- the attacks -------------------------------------------------------------------------------

Attack = Callable[[str, float], Awaitable[str]]


async def connections_until(address: str, stop_at: float, totals: Counter[str], *,
                            settings: bool = False) -> AsyncIterator[Raw]:
    """A new connection each time the last one is done with, until ``stop_at`` (with
    ``settings``: once the server's SETTINGS came); connections made and failed counted in
    ``totals``."""
    while time.monotonic() < stop_at:
        try:
            raw = await asyncio.wait_for(Raw.open(address), 5)
            if settings:
                await asyncio.wait_for(raw.settings_seen.wait(), 5)
        except (OSError, TimeoutError):
            totals["connect failed"] += 1
            await asyncio.sleep(0.1)
            continue
        totals["connections"] += 1
        yield raw


async def rapid_reset(address: str, stop_at: float, connections: int = 2) -> str:
    """HEADERS + RST_STREAM flat out on ``connections`` connections, each opened again when
    the server sends GOAWAY or closes it. Counted: the pairs handed to the kernel (the last
    batch before a GOAWAY was read may not have reached the server)."""
    block = header_block("Prove")
    totals: Counter[str] = Counter()
    goaways: Counter[int] = Counter()

    async def one() -> None:
        async for raw in connections_until(address, stop_at, totals):
            while not raw.closed and raw.goaway is None and time.monotonic() < stop_at:
                batch = []
                for _ in range(200):
                    stream, head = raw.headers(block, track=False)
                    batch += (head, frame(RST_STREAM, 0, stream, struct.pack("!I", CANCEL)))
                raw.write(b"".join(batch))
                totals["resets sent"] += 200
                await raw.drain(stop_at - time.monotonic())
            if raw.goaway is not None:
                goaways[raw.goaway] += 1
            raw.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return (f"{totals['resets sent']:,} HEADERS + RST_STREAM written on "
            f"{totals['connections']} connections; "
            f"GOAWAY {error_names(goaways)}")


async def metadata_flood(address: str, stop_at: float, connections: int = 2,
                         cap: int = 1000) -> str:
    """Complete ``GetStatus`` calls with 7 KiB of metadata, as many in flight on each
    connection as the server allows (at most ``cap``), again as soon as one ends."""
    block = header_block("GetStatus", (("x-junk", "j" * (7 << 10)),))
    body = grpc_message(b"")
    totals: Counter[str] = Counter()
    resets: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    peak = 0

    async def one() -> None:
        nonlocal peak
        async for raw in connections_until(address, stop_at, totals, settings=True):
            while not raw.closed and raw.goaway is None and time.monotonic() < stop_at:
                limit = min(cap, raw.max_streams or cap)
                batch = []
                while len(raw.open) < limit and raw.conn_window >= len(body) and len(batch) < 64:
                    stream, head = raw.headers(block)
                    batch += (head, raw.data(stream, body, end=True))
                    totals["sent"] += 1
                raw.write(b"".join(batch))
                peak = max(peak, len(raw.open))
                await raw.drain(stop_at - time.monotonic())
                if not batch:
                    await raw.changed(stop_at - time.monotonic())
            totals["answered"] += raw.answered
            resets.update(raw.resets)
            statuses.update(raw.statuses)
            raw.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return (f"{totals['sent']:,} calls sent, {totals['answered']:,} ended "
            f"({code_names(statuses)}), at most {peak} in flight on a connection, "
            f"{totals['connections']} connections; "
            f"resets {error_names(resets)}")


async def prove_flood(address: str, stop_at: float, ids: list[str], connections: int = 1,
                      within_bound: bool = False) -> str:
    """``len(ids)`` complete ``Prove`` calls spread over ``connections`` connections, held
    until ``stop_at``. ``within_bound``: each connection first reads the server's SETTINGS and
    opens at most its MAX_CONCURRENT_STREAMS (else: all at once, before reading them)."""
    block = header_block("Prove")
    per = -(-len(ids) // connections)
    raws: list[Raw] = []
    opened = 0

    async def one(chunk: list[str]) -> None:
        nonlocal opened
        raw = await asyncio.wait_for(Raw.open(address), 5)
        raws.append(raw)
        if within_bound:
            await asyncio.wait_for(raw.settings_seen.wait(), 5)
            chunk = chunk[:raw.max_streams or len(chunk)]
        pending: list[tuple[int, bytes]] = []
        for request_id in chunk:
            stream, head = raw.headers(block)
            raw.write(head)
            pending.append((stream, grpc_message(prove_bytes(request_id))))
            opened += 1
        while pending and not raw.closed and time.monotonic() < stop_at:
            while pending and raw.room(pending[0][0]) >= len(pending[0][1]):
                stream, body = pending.pop(0)
                raw.write(raw.data(stream, body, end=True))
            await raw.drain(stop_at - time.monotonic())
            if pending:
                await raw.changed(stop_at - time.monotonic())

    await asyncio.gather(*(one(ids[i:i + per]) for i in range(0, len(ids), per)),
                         return_exceptions=True)
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    goaways: Counter[int] = Counter(r.goaway for r in raws if r.goaway is not None)
    answered = sum(r.answered for r in raws)
    held, closed, resets, statuses = closed_tally(raws)
    return (f"{opened:,} calls opened on {len(raws)} connection(s); at the end {held:,} held "
            f"open, {answered:,} ended by the server ({code_names(statuses)}; resets "
            f"{error_names(resets)}), "
            f"{closed} connection(s) closed (GOAWAY {error_names(goaways)})")


async def big_requests(address: str, stop_at: float, streams: int = 24,
                       announced: int = 127 * MIB, sent: int = 40 * MIB) -> str:
    """``streams`` ``Prove`` calls on one connection, each announcing ``announced`` bytes and
    sending ``sent`` of them as the server's windows allow, then silent until ``stop_at``."""
    raw = await asyncio.wait_for(Raw.open(address), 5)
    block = header_block("Prove")
    left: dict[int, int] = {}
    began = time.monotonic()
    for _ in range(streams):
        stream, head = raw.headers(block)
        raw.write(head)
        left[stream] = sent
    prefixes = set(left)
    zeros = bytes(1 << 20)
    full_at: float | None = None
    while not raw.closed and time.monotonic() < stop_at and any(left.values()):
        batch, size = [], 0
        for stream in list(left):
            if stream not in raw.open:
                left[stream] = 0  # the server reset it
                continue
            if stream in prefixes:
                if raw.room(stream) < 5:
                    continue
                batch.append(raw.data(stream, struct.pack("!BI", 0, announced)))
                prefixes.discard(stream)
            n = min(raw.room(stream), raw.max_frame, left[stream])
            if n > 0:
                batch.append(raw.data(stream, zeros[:n]))
                left[stream] -= n
                size += n
        if batch:
            raw.write(b"".join(batch))
            await raw.drain(stop_at - time.monotonic())
        else:
            await raw.changed(stop_at - time.monotonic())
    if not any(left.values()) and not raw.closed:
        full_at = time.monotonic() - began
    delivered = streams * sent - sum(left.values())
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    unsent = raw.unsent()
    reset, closed, statuses = raw.resets, raw.closed, raw.statuses
    raw.close()
    when = f"all sent in {full_at:.1f} s" if full_at is not None else "held by flow control"
    return (f"{delivered / MIB:,.0f} MiB of {streams * sent / MIB:,.0f} MiB sent within the "
            f"server's windows ({when}; {unsent / MIB:,.0f} MiB still queued in this process at "
            f"the end); "
            f"streams reset by the server {error_names(reset)}, ended "
            f"{code_names(statuses)}; connection "
            f"{'closed' if closed else 'open'}")


async def window_zero(address: str, stop_at: float, connections: int = 4,
                      cap: int = 1000) -> str:
    """Connections whose INITIAL_WINDOW_SIZE is 0, each opening ``GetStatus`` calls (as many
    as the server allows, at most ``cap``) whose replies it never lets come."""
    block = header_block("GetStatus")
    body = grpc_message(b"")
    raws: list[Raw] = []
    sent = 0

    async def one() -> None:
        nonlocal sent
        raw = await asyncio.wait_for(Raw.open(address, window=0, reads=False), 5)
        raws.append(raw)
        await asyncio.wait_for(raw.settings_seen.wait(), 5)
        while not raw.closed and time.monotonic() < stop_at:
            limit = min(cap, raw.max_streams or cap)
            batch = []
            while len(raw.open) < limit and raw.conn_window >= len(body) and len(batch) < 64:
                stream, head = raw.headers(block)
                batch += (head, raw.data(stream, body, end=True))
                sent += 1
            raw.write(b"".join(batch))
            await raw.drain(stop_at - time.monotonic())
            if not batch:
                await raw.changed(stop_at - time.monotonic())

    await asyncio.gather(*(one() for _ in range(connections)), return_exceptions=True)
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    started = sum(r.replies_started for r in raws)
    held, closed, resets, statuses = closed_tally(raws)
    return (f"{sent:,} GetStatus opened on {len(raws)} connections, {started:,} replies "
            f"begun (HEADERS), {held:,} held unread at the end; ended {code_names(statuses)}; "
            f"resets {error_names(resets)}; "
            f"{closed} connection(s) closed")


async def silent(address: str, stop_at: float, count: int = 300) -> str:
    """``count`` connections that never send a byte, held until ``stop_at``; how many the
    server closed."""
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    failed = 0
    for _ in range(count):
        try:
            conns.append(await asyncio.wait_for(connect(address), 2))
        except (OSError, TimeoutError):
            failed += 1
    closed_at: list[float] = []
    began = time.monotonic()

    async def watch(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            await reader.read()
        closed_at.append(time.monotonic() - began)

    watchers = [asyncio.ensure_future(watch(r)) for r, _ in conns]
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    for task in watchers:
        task.cancel()
    for _, writer in conns:
        writer.close()
    first = f", the first after {min(closed_at):.1f} s" if closed_at else ""
    return (f"{len(conns)} connected ({failed} failed to connect); {len(closed_at)} closed by "
            f"the server{first}")


async def long_id(address: str, stop_at: float, size: int = 17 * MIB) -> str:
    """One ``Prove`` whose request_id is ``size`` bytes; then nothing until ``stop_at``."""
    import grpc

    async with grpc.aio.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 256 * MIB),
            ("grpc.max_receive_message_length", 256 * MIB)]) as chan:
        began = time.monotonic()
        try:
            await chan.unary_unary(SERVICE + "Prove")(
                prove_bytes("r" * size), timeout=max(1.0, stop_at - time.monotonic()))
            outcome = "OK"
        except grpc.aio.AioRpcError as exc:
            outcome = f"{exc.code().name} ({(exc.details() or '')[:80]})"
        took = time.monotonic() - began
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    return f"the call ended {outcome} after {took:.1f} s"


async def padded(address: str, stop_at: float, connections: int = 2,
                 submit: int = 120 * MIB, status: int = 4 * MIB) -> str:
    """Whole, valid calls flat out on ``connections`` connections: on each, one after
    another, a ``SubmitProof`` carrying ``submit`` bytes and, beside it, ``GetStatus`` requests
    padded with ``status`` bytes of an unknown field (protobuf keeps them; cuzk ignores them)."""
    import grpc

    from cuzkd.cuzk import proving_pb2 as pb

    payload = bytes(submit)
    padding = b"\x7a" + _varint(status) + bytes(status)  # field 15, length-delimited
    sent: Counter[str] = Counter()
    codes: Counter[str] = Counter()

    async def loop(method: str, request: Callable[[int], bytes]) -> None:
        async with grpc.aio.insecure_channel(address, options=[
                ("grpc.max_send_message_length", 256 * MIB),
                ("grpc.max_receive_message_length", 256 * MIB)]) as chan:
            call = chan.unary_unary(SERVICE + method)
            while (left := stop_at - time.monotonic()) > 0:
                sent[method] += 1
                try:
                    await call(request(sent[method]), timeout=left)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1

    def submit_bytes(n: int) -> bytes:
        return pb.SubmitProofRequest(
            request_id=f"pad-{os.getpid()}-{n}-{time.monotonic_ns()}",
            proof_kind=pb.POREP_SEAL_COMMIT, priority=pb.NORMAL, sector_size=32 << 30,
            vanilla_proof=payload).SerializeToString()

    await asyncio.gather(*(task for _ in range(connections) for task in (
        loop("SubmitProof", submit_bytes), loop("GetStatus", lambda n: padding))))
    return (f"{sent['SubmitProof']:,} SubmitProof of {submit / MIB:.0f} MiB and "
            f"{sent['GetStatus']:,} GetStatus padded to {status / MIB:.0f} MiB on "
            f"{connections} connections; ended {code_names(codes)}")


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


async def nothing(address: str, stop_at: float) -> str:
    await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
    return "-"


NEVER_ANSWERED = [f"a{i}" for i in range(3072)]


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    attack: Attack
    engines: tuple[dict[str, str], ...] = ({},)  # each engine's extra environment
    nofile: int | None = None


SCENARIOS = [
    Scenario("baseline", "quiet host: the honest caller alone", nothing),
    Scenario("rapid_reset", "1. rapid reset: HEADERS + RST_STREAM flat out, 2 connections",
             rapid_reset),
    Scenario("metadata", "2. GetStatus with 7 KiB of metadata flat out, 2 connections",
             metadata_flood),
    Scenario("prove_flood", "3. 3,000 Proves at once on one connection, never answered",
             lambda a, s: prove_flood(a, s, NEVER_ANSWERED[:3000]),
             ({"CUZK_STANDIN_NEVER_ANSWER": ",".join(NEVER_ANSWERED)},)),
    Scenario("prove_flood_24", "3b. 3,072 Proves on 24 connections within the advertised "
             "bound, never answered",
             lambda a, s: prove_flood(a, s, NEVER_ANSWERED, 24, within_bound=True),
             ({"CUZK_STANDIN_NEVER_ANSWER": ",".join(NEVER_ANSWERED)},)),
    Scenario("big_requests", "4. 24 streams announcing 127 MiB, 40 MiB sent, then silent",
             big_requests),
    Scenario("window_zero", "5. INITIAL_WINDOW_SIZE 0, GetStatus replies never read, "
             "4 connections", window_zero),
    Scenario("silent", "6. 300 connections that never send the preface (cuzkd nofile 256)",
             silent, nofile=256),
    Scenario("long_id", "7. one Prove whose request_id is 17 MiB", long_id),
    Scenario("padded", "7b. 120 MiB SubmitProofs and GetStatus padded to 4 MiB, flat out, "
             "2 connections", padded),
    Scenario("shared", "8a. shared door, two well engines (no attacker)", nothing, ({}, {})),
    Scenario("shared_slow", "8b. shared door, one engine's GetStatus takes 5 s (no attacker)",
             nothing, ({}, {"CUZK_STANDIN_NVIDIA_SMI_SECS": "5"})),
]


# -- the honest caller (a process of its own) ----------------------------------------------------

async def honest(address: str, grace: float) -> None:
    """One connection, a GetStatus every second and a 1 MB Prove every 2 s until a line on
    stdin (and, apart, every 2 s a GetStatus on a new connection: ``fresh``); then each call
    still unanswered ``grace`` seconds later is cut (``UNANSWERED``). Prints ``ready`` after
    its first answer, then one JSON list of calls."""
    import grpc

    from cuzkd.cuzk import proving_pb2 as pb

    payload = os.urandom(MIB)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), loop.call_soon_threadsafe(
        stop.set)), daemon=True).start()
    chan = grpc.aio.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 256 * MIB),
        ("grpc.max_receive_message_length", 256 * MIB)])
    status = chan.unary_unary(SERVICE + "GetStatus")
    prove = chan.unary_unary(SERVICE + "Prove")
    calls: list[dict[str, Any]] = []
    tasks: set[asyncio.Task[None]] = set()
    ready = asyncio.Event()
    cut = False

    async def one(kind: str, send: Callable[[], Awaitable[bytes]]) -> None:
        record = {"kind": kind, "sent": time.monotonic(), "code": "PENDING", "latency": None,
                  "completed": False}
        calls.append(record)
        try:
            reply = await send()
            record["code"] = "OK"
            if kind == "Prove":
                record["completed"] = (pb.ProveResponse.FromString(reply).result.status
                                       == pb.AwaitProofResponse.COMPLETED)
            ready.set()
        except grpc.aio.AioRpcError as exc:
            record["code"] = exc.code().name
            record["detail"] = (exc.details() or "")[:100]
        except asyncio.CancelledError:
            record["code"] = "UNANSWERED"  # cut, ``grace`` after the attack
            raise
        finally:
            if record["code"] in ("PENDING", "CANCELLED") and cut:
                record["code"] = "UNANSWERED"
        record["latency"] = time.monotonic() - record["sent"]

    def spawn(kind: str, send: Callable[[], Awaitable[bytes]]) -> None:
        task = asyncio.ensure_future(one(kind, send))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def every(period: float, kind: str, send: Callable[[], Awaitable[bytes]]) -> None:
        start, n = time.monotonic(), 0
        while not stop.is_set():
            spawn(kind, send)
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, start + n * period
                                                        - time.monotonic()))

    ids = iter(range(1 << 30))
    tag = os.urandom(4).hex()
    async def fresh() -> bytes:
        """A GetStatus on a connection of its own (a Curio that reconnects)."""
        async with grpc.aio.insecure_channel(address) as own:
            reply: bytes = await own.unary_unary(SERVICE + "GetStatus")(b"", timeout=5)
            return reply

    runners = [asyncio.ensure_future(every(1.0, "GetStatus", lambda: status(b"", timeout=5))),
               asyncio.ensure_future(every(2.0, "fresh", fresh)),
               asyncio.ensure_future(every(2.0, "Prove", lambda: prove(
                   prove_bytes(f"honest-{tag}-{next(ids)}", payload), timeout=60)))]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(ready.wait(), 30)
    print("ready", flush=True)
    await stop.wait()
    await asyncio.gather(*runners)
    if tasks:
        await asyncio.wait(set(tasks), timeout=grace)
    cut = True
    for task in list(tasks):
        task.cancel()
    await asyncio.sleep(0.1)
    print(json.dumps(calls), flush=True)
    await chan.close(grace=0)


# -- watching cuzkd ------------------------------------------------------------------------------

def proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, CPU ticks, start time) of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])


def _status_bytes(pid: int, field: str) -> int:
    """A size ``/proc/PID/status`` gives in kB (``VmRSS``, ``VmHWM``), 0 if gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss(pid: int) -> int:
    return _status_bytes(pid, "VmRSS")


def hwm(pid: int) -> int:
    """The peak RSS of ``pid`` so far."""
    return _status_bytes(pid, "VmHWM")


def descriptors(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return "other"
    if b"cuzkd.supervisor.door.process" in cmd:
        return "door"
    return "engine" if b"cuzk_standin.py" in cmd else "other"


class Monitor(threading.Thread):
    """cuzkd and its descendants sampled every ``interval``: RSS, descriptors (the
    supervisor's), CPU ticks per pid; each descendant's role and start time."""

    def __init__(self, sup: int, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.sup, self.interval = sup, interval
        self.samples: list[tuple[float, dict[int, tuple[str, int, int]], int]] = []
        self.seen: dict[int, tuple[str, int]] = {}  # pid -> (role, start time)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def sample(self) -> None:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
                children.setdefault(stat[0], []).append(int(entry))
        now = time.monotonic()
        found: dict[int, tuple[str, int, int]] = {}
        todo = [self.sup]
        while todo:
            pid = todo.pop()
            stat = proc_stat(pid)
            if stat is None:
                continue
            if pid not in self.seen:
                self.seen[pid] = ("supervisor" if pid == self.sup else role(pid), stat[2])
            found[pid] = (self.seen[pid][0], rss(pid), stat[1])
            todo.extend(children.get(pid, ()))
        self.samples.append((now, found, descriptors(self.sup)))

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def window(self, start: float, end: float) -> list[tuple[float, dict[int, tuple[str, int,
                                                                                  int]], int]]:
        return [s for s in self.samples if start <= s[0] <= end]

    def peak_rss(self, who: str, start: float, end: float) -> int:
        return max((sum(v[1] for v in found.values() if v[0] == who)
                    for _, found, _ in self.window(start, end)), default=0)

    def peak_fds(self, start: float, end: float) -> int:
        return max((fds for _, _, fds in self.window(start, end)), default=0)

    def cpu_percent(self, who: str, start: float, end: float) -> float:
        """CPU of ``who``'s processes between the samples nearest ``start`` and ``end``."""
        window = self.window(start, end)
        if len(window) < 2:
            return 0.0
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for _, found, _ in window:
            for pid, (r, _, ticks) in found.items():
                if r == who:
                    first.setdefault(pid, ticks)
                    last[pid] = ticks
        ticks = sum(last[p] - first[p] for p in last)
        return 100.0 * ticks / os.sysconf("SC_CLK_TCK") / (window[-1][0] - window[0][0])

    def pids(self, who: str) -> list[int]:
        return [pid for pid, (r, _) in self.seen.items() if r == who]


class Probe(threading.Thread):
    """Every second a ``GET /v1/supervisor`` on the control socket, then a scrape of
    ``/metrics``: each one's seconds, or None when it got no answer within 3 s."""

    def __init__(self, control: Path, metrics: str) -> None:
        super().__init__(daemon=True)
        self.control = control
        self.metrics = metrics
        self.results: list[tuple[float, float | None]] = []
        self.scrapes: list[tuple[float, float | None]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        from cuzkd.cli.control_client import call

        while not self._halt.is_set():
            began = time.monotonic()
            self.results.append((began, self._timed(lambda: bool(call(
                self.control, "GET", "/v1/supervisor", timeout=3)))))
            self.scrapes.append((time.monotonic(), self._timed(self._scrape)))
            self._halt.wait(max(0.0, 1.0 - (time.monotonic() - began)))

    def _scrape(self) -> bool:
        with urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=3) as resp:
            resp.read()
            return bool(resp.status == 200)

    @staticmethod
    def _timed(ask: Callable[[], bool]) -> float | None:
        from cuzkd.errors import CuzkdError

        began = time.monotonic()
        try:
            ok = ask()
        except (OSError, ValueError, CuzkdError):
            ok = False
        return time.monotonic() - began if ok else None

    def stop(self) -> None:
        self._halt.set()
        self.join(5)


def scrape(metrics: str, name: str) -> dict[str, float]:
    """Every series of ``name`` (its labels -> value) in a scrape of cuzkd (empty if none)."""
    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as resp:
            lines = resp.read().decode().splitlines()
    except OSError:
        return {}
    return {line.rsplit(" ", 1)[0][len(name):]: float(line.rsplit(" ", 1)[1])
            for line in lines if line.startswith(name + "{")}


# -- one scenario --------------------------------------------------------------------------------

def toml(tables: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    out = []
    for name, body in tables.items():
        for item in body if isinstance(body, list) else [body]:
            out.append(f"[[{name}]]" if isinstance(body, list) else f"[{name}]")
            out += [f"{k} = {value(v)}" for k, v in item.items()]
            out.append("")
    return "\n".join(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Result:
    scenario: str
    what: str
    label: str
    attacker: str = ""
    honest: list[dict[str, Any]] = field(default_factory=list)
    #: GetStatus calls each on a new connection, every 2 s
    fresh: list[dict[str, Any]] = field(default_factory=list)
    window: float = 0.0
    sup_rss_start: int = 0
    sup_rss_peak: int = 0
    sup_cpu: float = 0.0
    sup_fds_start: int = 0
    sup_fds_peak: int = 0
    door_rss_start: int = 0
    door_rss_peak: int = 0
    door_cpu: float = 0.0
    door_pids: int = 0
    engine_cpu: float = 0.0
    engine_restarts: int = 0
    engine_pids: int = 0
    engines: int = 1
    control_slowest: float | None = None
    control_unanswered: int = 0
    control_probes: int = 0
    metrics_slowest: float | None = None
    metrics_unanswered: int = 0
    bench_cpu: float = 0.0
    bounds_hit: dict[str, float] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def start_cuzkd(checkout: Path, config: Path, log: Path, nofile: int | None) -> subprocess.Popen[
        bytes]:
    def limits() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cuzkd", "run", "--config", str(config)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            # cwd: ``python -m`` puts it first on sys.path, before PYTHONPATH
            env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout,
            start_new_session=True, preexec_fn=limits)


def wait_running(control: Path, proc: subprocess.Popen[bytes], names: list[str],
                 timeout: float = 90) -> dict[str, Any]:
    from cuzkd.cli.control_client import call
    from cuzkd.errors import CuzkdError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cuzkd exited {proc.returncode} at start")
        with contextlib.suppress(CuzkdError):
            states = {e["name"]: e["state"]
                      for e in call(control, "GET", "/v1/engines", timeout=3)["engines"]}
            if all(states.get(n) == "running" for n in names):
                return call(control, "GET", "/v1/supervisor", timeout=3)  # type: ignore[no-any-return]
        time.sleep(0.3)
    raise SystemExit(f"engines {names} not running after {timeout} s")


def stop_cuzkd(proc: subprocess.Popen[bytes], seen: dict[int, tuple[str, int]]) -> str:
    """SIGTERM; 20 s on, SIGKILL to its process group and each descendant still alive (the same
    process: its start time unchanged). How it went."""
    how = "stopped on SIGTERM"
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        how = "did not stop within 20 s of SIGTERM: killed"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    time.sleep(0.5)
    for pid, (_, start) in seen.items():
        stat = proc_stat(pid)
        if stat is not None and stat[2] == start:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return how


def log_events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                out.append(record)
    return out


def run_scenario(scenario: Scenario, args: argparse.Namespace) -> Result:
    checkout: Path = args.checkout
    tmp = Path(tempfile.mkdtemp(prefix="czatk", dir="/tmp"))
    result = Result(scenario.name, scenario.what, args.label, engines=len(scenario.engines))
    standin = checkout / "tests" / "support" / "cuzk_standin.py"
    shared = len(scenario.engines) > 1
    door_address = (f"127.0.0.1:{free_port()}" if args.tcp else f"unix://{tmp}/curio.sock")
    engines, names = [], []
    for i, env in enumerate(scenario.engines):
        name = f"cuzk{i}"
        listen = door_address if not shared else f"unix://{tmp}/{name}.sock"
        cuzk_toml = tmp / f"{name}.toml"
        cuzk_toml.write_text(toml({"daemon": {"listen": listen,
                                              "status_listen": f"127.0.0.1:{free_port()}"},
                                   "memory": {"total_budget": "140GiB"}}))
        engines.append({"name": name, "type": "cuzk", "door": door_address if shared else "",
                        "command": [sys.executable, str(standin), "-c", str(cuzk_toml)],
                        "env": {**KNOBS, **env}, "stop_timeout": "2s", "drain_timeout": "3s"})
        names.append(name)
    config = tmp / "cuzkd.toml"
    config.write_text(toml({"supervisor": {"state_dir": str(tmp / "state"),
                                           "shutdown_grace": "10s"},
                            "metrics": {"listen": "127.0.0.1:0"}, "engine": engines}))
    log = tmp / "cuzkd.log"
    control = tmp / "state" / "control.sock"
    proc = start_cuzkd(checkout, config, log, scenario.nofile)
    monitor = Monitor(proc.pid)
    probe: Probe | None = None
    caller: subprocess.Popen[str] | None = None
    try:
        about = wait_running(control, proc, names)
        monitor.start()
        probe = Probe(control, about["metrics_listen"])
        probe.start()
        caller = subprocess.Popen(
            [sys.executable, __file__, "--honest", door_address, "--grace", str(args.grace)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(checkout)})
        assert caller.stdout is not None and caller.stdin is not None
        if caller.stdout.readline().strip() != "ready":
            result.notes.append("the honest caller did not start")
        time.sleep(args.warm)
        monitor.sample()
        start = time.monotonic()
        cpu0 = sum(os.times()[:2])
        stop_at = start + args.seconds
        try:
            result.attacker = asyncio.run(asyncio.wait_for(scenario.attack(door_address,
                                                                           stop_at),
                                                           args.seconds + 30))
        except Exception as exc:  # the attack itself broke: say so, measure the rest
            result.attacker = f"attacker stopped: {type(exc).__name__} {exc}"
        end = time.monotonic()
        result.bench_cpu = 100.0 * (sum(os.times()[:2]) - cpu0) / (end - start)
        monitor.sample()
        caller.stdin.write("stop\n")
        caller.stdin.flush()
        box: list[str] = []
        stdout = caller.stdout
        thread = threading.Thread(target=lambda: box.append(stdout.read()), daemon=True)
        thread.start()
        thread.join(args.grace + 20)
        out = box[0] if box else ""
        calls = json.loads(out.strip().splitlines()[-1]) if out.strip() else []
        if not box:
            result.notes.append("the honest caller did not report in time: its calls unknown")
        result.honest = [c for c in calls if start <= c["sent"] <= end and c["kind"] != "fresh"]
        result.fresh = [c for c in calls if start <= c["sent"] <= end and c["kind"] == "fresh"]
        details = {f"{c['kind']} {c['code']}": c.get("detail") for c in result.honest
                   if c["code"] != "OK" and c.get("detail")}
        result.notes += [f"honest {k}: \"{v}\"" for k, v in details.items()]
        measured = time.monotonic()
        monitor.sample()
        result.window = end - start
        result.sup_rss_start = monitor.peak_rss("supervisor", start - 1, start + 0.01)
        result.sup_rss_peak = max(monitor.peak_rss("supervisor", start, measured),
                                  hwm(proc.pid))
        result.sup_fds_start = monitor.peak_fds(start - 1, start + 0.01)
        result.sup_fds_peak = monitor.peak_fds(start, measured)
        result.sup_cpu = monitor.cpu_percent("supervisor", start, end)
        result.door_rss_start = monitor.peak_rss("door", start - 1, start + 0.01)
        result.door_rss_peak = max([monitor.peak_rss("door", start, measured)]
                                   + [hwm(pid) for pid in monitor.pids("door")])
        result.door_cpu = monitor.cpu_percent("door", start, end)
        result.door_pids = len(monitor.pids("door"))
        result.engine_cpu = monitor.cpu_percent("engine", start, end)
        result.engine_pids = len(monitor.pids("engine"))
        answered = [t for began, t in probe.results if start <= began <= measured]
        result.control_probes = len(answered)
        result.control_unanswered = sum(t is None for t in answered)
        result.control_slowest = max((t for t in answered if t is not None), default=None)
        result.metrics_slowest = max((t for began, t in probe.scrapes
                                      if start <= began <= measured and t is not None),
                                     default=None)
        result.metrics_unanswered = sum(t is None for began, t in probe.scrapes
                                        if start <= began <= measured)
        result.bounds_hit = {k: v for k, v in scrape(about["metrics_listen"],
                                                     "cuzkd_door_bounds_hit_total").items()
                             if v}
        events = log_events(log)
        result.engine_restarts = max(sum(e.get("event") == "engine_exited" for e in events),
                                     result.engine_pids - result.engines)
        logged: Counter[str] = Counter()
        for e in events:
            if e.get("event") == "door_bound_hit":
                logged[str(e.get("bound"))] += int(e.get("repeated") or 1)
        result.notes += [f"door_bound_hit {b} logged {n:,} times" for b, n in logged.items()
                         if n > 1000]
        result.events = dict(Counter(str(e.get("event")) for e in events
                                     if e.get("level") in ("warning", "error", "critical")))
        if proc.poll() is not None:
            result.notes.append(f"cuzkd exited {proc.returncode} during the scenario")
    finally:
        if probe is not None:
            probe.stop()
        monitor.stop()
        if caller is not None and caller.poll() is None:
            caller.kill()
        how = stop_cuzkd(proc, monitor.seen)
        if how != "stopped on SIGTERM":
            result.notes.append(f"cuzkd {how}")
        if args.keep:
            print(f"{scenario.name}: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return result


# -- tables ----------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(calls: list[dict[str, Any]], kind: str) -> str:
    done = [c["latency"] for c in calls if c["kind"] == kind and c["code"] == "OK"]
    if not done:
        return "none answered"
    return f"{pct(done, .5) * 1e3:.0f} / {pct(done, .99) * 1e3:.0f} ms ({len(done)})"


def failures(calls: list[dict[str, Any]]) -> str:
    codes = Counter(f"{c['kind']} {c['code']}" for c in calls if c["code"] != "OK")
    return ", ".join(f"{k} {n}" for k, n in codes.most_common()) or "0"


def mib(n: int) -> str:
    return f"{n / MIB:,.0f} MiB" if n else "-"


def fresh_cell(calls: list[dict[str, Any]]) -> str:
    ok = [c["latency"] for c in calls if c["code"] == "OK"]
    codes = Counter(c["code"] for c in calls if c["code"] != "OK")
    failed = ", ".join(f"{k} {n}" for k, n in codes.most_common())
    median = f"{pct(ok, .5) * 1e3:.0f} ms" if ok else "none answered"
    return f"{len(calls) - len(ok)} of {len(calls)}" + (f" ({failed})" if failed else "") + (
        f", {median}")


def honest_row(r: Result) -> str:
    proves = [c for c in r.honest if c["kind"] == "Prove"]
    lost = sum(not c["completed"] for c in proves)
    return (f"| {r.scenario} | {r.label} | {len(r.honest)} | {failures(r.honest)} | "
            f"{latency(r.honest, 'GetStatus')} | {latency(r.honest, 'Prove')} | "
            f"{lost} of {len(proves)} | {fresh_cell(r.fresh)} |")


def cost_row(r: Result) -> str:
    if r.control_probes == 0:
        control = "no probe"
    elif r.control_unanswered == r.control_probes:
        control = f"unresponsive ({r.control_unanswered} of {r.control_probes} unanswered)"
    else:
        slowest = f"{r.control_slowest * 1e3:.0f} ms" if r.control_slowest is not None else "-"
        control = slowest + (f", {r.control_unanswered} of {r.control_probes} unanswered"
                             if r.control_unanswered else "")
    scrape = "-" if r.metrics_slowest is None else f"{r.metrics_slowest * 1e3:.0f} ms"
    control += f" / {scrape}" + (f" ({r.metrics_unanswered} unanswered)"
                                 if r.metrics_unanswered else "")
    door = (f"{mib(r.door_rss_start)} → {mib(r.door_rss_peak)}, {r.door_cpu:.0f}%"
            + (f", {r.door_pids - 1} restart(s)" if r.door_pids > 1 else "")
            if r.door_pids else "(in the supervisor)")
    return (f"| {r.scenario} | {r.label} | {mib(r.sup_rss_start)} → {mib(r.sup_rss_peak)} | "
            f"{r.sup_cpu:.0f}% | {r.sup_fds_start} → {r.sup_fds_peak} | {control} | {door} | "
            f"{r.engine_cpu:.0f}% | {r.engine_restarts} | {r.bench_cpu:.0f}% |")


def label(labels: str, name: str) -> str:
    """The value of ``name`` in a series' ``{a="x",b="y"}``."""
    return labels.split(f'{name}="', 1)[1].split('"', 1)[0] if f'{name}="' in labels else labels


def print_tables(results: list[Result]) -> None:
    order = {s.name: i for i, s in enumerate(SCENARIOS)}
    results = sorted(results, key=lambda r: (order.get(r.scenario, 99), r.label))
    print("| attack | checkout | honest calls | failed (codes) | GetStatus p50 / p99 (n) | "
          "Prove p50 / p99 (n) | proofs lost | new connection's GetStatus: failed, p50 |")
    print("|---|---|---:|---|---:|---:|---:|---|")
    for r in results:
        print(honest_row(r))
    print("\n| attack | checkout | supervisor RSS | supervisor CPU | supervisor fds | control "
          "API / /metrics slowest | door process RSS, CPU | engine CPU | engine restarts "
          "| attacker CPU |")
    print("|---|---|---:|---:|---:|---|---|---:|---:|---:|")
    for r in results:
        print(cost_row(r))
    print("\n| attack | checkout | what the attacker saw | door bounds hit | warnings logged |")
    print("|---|---|---|---|---|")
    for r in results:
        bounds = ", ".join(f"{label(k, 'bound')} {v:g}" for k, v in r.bounds_hit.items()) or "-"
        events = ", ".join(f"{k} {n}" for k, n in sorted(r.events.items(),
                                                          key=lambda kv: -kv[1])[:4]) or "-"
        notes = ("; " + "; ".join(r.notes)) if r.notes else ""
        print(f"| {r.scenario} | {r.label} | {r.attacker}{notes} | {bounds} | {events} |")
    print("\nlegend: " + "; ".join(f"`{s.name}`: {s.what}" for s in SCENARIOS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkout", type=Path, help="the cuzkd checkout under test")
    parser.add_argument("--label", default="", help="its name in the tables (default: dir)")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in SCENARIOS])
    parser.add_argument("--seconds", type=float, default=15.0, help="each attack's length")
    parser.add_argument("--warm", type=float, default=3.0, help="honest calls before it")
    parser.add_argument("--grace", type=float, default=20.0,
                        help="s after the attack for the honest calls still unanswered")
    parser.add_argument("--tcp", action="store_true", help="the door on 127.0.0.1:PORT")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--keep", action="store_true", help="keep each scenario's directory")
    parser.add_argument("--merge", nargs="+", type=Path, help="print tables of JSON results")
    parser.add_argument("--honest", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.honest:
        asyncio.run(honest(args.honest, args.grace))
        return
    if args.merge:
        print_tables([Result(**r) for path in args.merge for r in json.loads(path.read_text())])
        return
    if args.checkout is None:
        parser.error("--checkout (or --merge) is required")
    args.checkout = args.checkout.resolve()
    import cuzkd

    if not Path(cuzkd.__file__).resolve().is_relative_to(args.checkout):
        raise SystemExit(f"cuzkd imported from {cuzkd.__file__}, not {args.checkout}: "
                         f"run with PYTHONPATH={args.checkout}")
    args.label = args.label or args.checkout.name
    results = []
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        print(f"{scenario.name} ...", file=sys.stderr, flush=True)
        results.append(run_scenario(scenario, args))
        if args.json:
            args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(f"{args.label}: {os.cpu_count()} CPUs, attacks of {args.seconds:g} s\n")
    print_tables(results)


if __name__ == "__main__":
    main()
