"""A raw HTTP/2 client on the ``h2`` library, for the door's hostile callers: it opens streams,
sends what it likes (huge metadata, a length it never delivers), resets, never reads, and
tells what the server said (GOAWAY, resets, responses).

It runs on the test's event loop; everything it receives is kept in :attr:`RawH2.events`, and
:meth:`RawH2.wait_for` awaits one the test names (never a sleep).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Sequence

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from support.waiting import until

#: gRPC's request headers for ``method`` of cuzk's service, as grpc-go sends them
SERVICE = "/cuzk.v1.ProvingEngine/"


def grpc_headers(method: str, *, extra: Sequence[tuple[str, str]] = (),
                 authority: str = "localhost") -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + method),
            (":authority", authority), ("content-type", "application/grpc"),
            ("te", "trailers"), *extra]


def message(body: bytes, *, declared: int | None = None) -> bytes:
    """``body`` behind gRPC's 5-byte prefix (``declared``: the length it claims)."""
    return struct.pack("!BI", 0, len(body) if declared is None else declared) + body


class RawH2:
    """One connection; ``read``: whether it reads what the server sends (a caller that never
    reads leaves the server's writes in its socket buffer)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 *, window: int | None = None) -> None:
        self._reader, self._writer = reader, writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8", validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self.conn.initiate_connection()
        if window is not None:  # the caller's receive window (0: it reads no reply)
            self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.events: list[h2.events.Event] = []
        self.closed = False
        self.flush()
        self._reading = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(cls, address: str, *, window: int | None = None) -> RawH2:
        """Connect to ``unix:///PATH`` or ``HOST:PORT``."""
        if address.startswith("unix:"):
            reader, writer = await asyncio.open_unix_connection(
                address.removeprefix("unix:").removeprefix("//"))
        else:
            host, _, port = address.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, window=window)

    def flush(self) -> None:
        if not self._writer.is_closing():
            self._writer.write(self.conn.data_to_send())

    async def drain(self) -> None:
        """Wait until what was sent left this process (the server may not be reading)."""
        self.flush()
        try:
            await self._writer.drain()
        except ConnectionError:
            self.closed = True

    def call(self, method: str, body: bytes, *, end: bool = True,
             extra: Sequence[tuple[str, str]] = ()) -> int:
        """A call's headers and ``body`` (already framed, :func:`message`); its stream id."""
        stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream, grpc_headers(method, extra=extra), end_stream=not body
                               and end)
        if body:
            self.send(stream, body, end=end)
        self.flush()
        return stream

    def send(self, stream: int, data: bytes, *, end: bool = False) -> None:
        """``data`` on ``stream``, as far as the server's windows allow (the rest dropped)."""
        room = min(len(data), self.conn.local_flow_control_window(stream))
        for start in range(0, room, self.conn.max_outbound_frame_size):
            chunk = data[start:min(room, start + self.conn.max_outbound_frame_size)]
            self.conn.send_data(stream, chunk)
        if end:
            self.conn.end_stream(stream)
        self.flush()

    def raw(self, data: bytes) -> None:
        """``data`` as it is, after what h2 has to send (a frame h2 would not write)."""
        self.flush()
        self._writer.write(data)

    def reset(self, stream: int) -> None:
        self.conn.reset_stream(stream)
        self.flush()

    def close(self) -> None:
        self._reading.cancel()
        self._writer.close()

    async def wait_for(self, kind: type[h2.events.Event],
                       match: Callable[[h2.events.Event], bool] = lambda e: True,
                       timeout: float = 20.0) -> h2.events.Event:
        """The first event of ``kind`` (matching) received, once it is."""
        def found() -> h2.events.Event | None:
            return next((e for e in self.events if isinstance(e, kind) and match(e)), None)
        await until(found, f"{kind.__name__} from the server", timeout)
        event = found()
        assert event is not None
        return event

    async def wait_closed(self, timeout: float = 20.0) -> None:
        await until(lambda: self.closed, "the server to close the connection", timeout)

    def ended(self, stream: int) -> bool:
        """The server ended ``stream`` (its trailers, or a reset)."""
        return any(isinstance(e, h2.events.StreamEnded | h2.events.StreamReset)
                   and e.stream_id == stream for e in self.events)

    def status(self, stream: int) -> str | None:
        """The ``grpc-status`` the server ended ``stream`` with (None: none yet)."""
        for event in self.events:
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived) \
                    and event.stream_id == stream:
                for name, value in event.headers or ():
                    if name == "grpc-status":
                        return str(value)
        return None

    async def _read(self) -> None:
        try:
            while data := await self._reader.read(65536):
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    break
                self.events.extend(events)
                for event in events:
                    if isinstance(event, h2.events.DataReceived):
                        self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                            event.stream_id)
                self.flush()
        except ConnectionError:
            pass
        finally:
            self.closed = True
