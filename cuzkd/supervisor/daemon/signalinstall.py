"""Putting :data:`cuzkd.supervisor.core.signals.TABLE` in place: at the entry, then on the loop.

``cuzkd run`` spends most of a second importing (aiohttp, NumPy, the daemon) and reading its
config before the event loop exists. Until this module, a signal in that window did the
kernel's default -- ``SIGTERM``/``SIGHUP`` killed the process silently, ``SIGINT`` printed a
``KeyboardInterrupt`` traceback. :func:`hold` runs first thing at the ``run`` entry
(:mod:`cuzkd.cli`), before any heavy import, and gives every signal of the table a handler that
only notes the arrival; :class:`LoopSignals` then installs the loop's handlers and replays what
was noted, so a stop signal during start-up is one stop, handled like any other: logged, no
engine is started, exit 0 (see docs/supervisor.md, "Stray signals and start-up").

After the loop's handlers are removed at the very end, the noting handlers are back (idle
then): a signal while the process winds down is ignored, never the default that kills.
Nothing here is imported by ``cuzkd`` for other subcommands, and it imports nothing heavy.

Handling some fifty signals has a cost CPython does not plan for: a handler interrupted by
another signal runs the next handler on top of it, and with :mod:`faulthandler` active (ours for
``SIGQUIT``, or ``PYTHONFAULTHANDLER=1``) every handler runs on its alternate signal stack,
about 10 KiB on Python 3.11: five or six different signals in one burst overflowed it and the
supervisor died of SIGSEGV. :func:`widen_signal_stack` gives that stack room for every handler
of the table at once.
"""

from __future__ import annotations

import faulthandler
import signal
from collections.abc import Callable, Sequence
from types import FrameType

from cuzkd.supervisor.core.signals import TABLE

#: ``typing.TYPE_CHECKING`` without importing ``typing`` (mypy reads any such name as true):
#: :func:`hold` runs in the window it shortens.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import asyncio

#: What ``signal.getsignal`` answers: a handler, ``SIG_DFL``/``SIG_IGN``, or None (set in C).
Disposition = Callable[[int, FrameType | None], object] | int | signal.Handlers | None

#: signal -> arrivals noted since :func:`hold`; None when nothing holds (or once handed over)
_noted: dict[int, int] | None = None

#: Bytes of alternate signal stack: every handler of the table nested at once, each with a
#: kernel signal frame of a few KiB (the saved vector registers) and the C handler's own frame.
SIGNAL_STACK_BYTES = 1 << 20
_SS_DISABLE = 2  # sigaltstack(2): no alternate stack


def _note(signum: int, frame: FrameType | None) -> None:
    del frame
    if _noted is not None:
        _noted[signum] = _noted.get(signum, 0) + 1


def hold() -> None:
    """Note every signal of the table from now on instead of its default (see module doc)."""
    global _noted
    _noted = {}
    for signum in TABLE:
        signal.signal(signum, _note)
    widen_signal_stack()  # PYTHONFAULTHANDLER=1 set one up already


def widen_signal_stack() -> None:
    """Replace this thread's alternate signal stack, if it has one and it is smaller, with one
    of :data:`SIGNAL_STACK_BYTES` (see module doc). Without one, handlers run on the thread's
    own stack, which is large enough; nothing is done then.

    The memory comes from ``malloc`` and is never freed: the stack stays installed until the
    process ends, through the interpreter's finalization.
    """
    import ctypes  # here: hold() runs before anything else is imported

    class StackT(ctypes.Structure):
        _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int),
                    ("ss_size", ctypes.c_size_t)]

    libc = ctypes.CDLL(None)  # dlopen(NULL): the process itself, never fails
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    current = StackT()
    if libc.sigaltstack(None, ctypes.byref(current)) != 0:
        return
    if current.ss_flags & _SS_DISABLE or current.ss_size >= SIGNAL_STACK_BYTES:
        return
    memory = libc.malloc(SIGNAL_STACK_BYTES)
    if memory:
        libc.sigaltstack(ctypes.byref(StackT(memory, 0, SIGNAL_STACK_BYTES)), None)


def unblock_after_exec(argv: Sequence[str]) -> None:
    """For ``cuzkd run --handover FD`` (``cuzkd upgrade``'s exec): put back the signal mask the
    old code had before it blocked every signal for the exec. Run right after :func:`hold`,
    so a signal that came in the gap is noted now and handled as during start-up (a
    ``SIGTERM`` is one stop). The mask is read from the hand-over in place (``pread``: the
    daemon reads the whole of it later)."""
    if "--handover" not in argv:
        return
    import os

    import msgspec

    try:
        fd = int(argv[argv.index("--handover") + 1])
        chunks, offset = [], 0
        while chunk := os.pread(fd, 1 << 20, offset):
            chunks.append(chunk)
            offset += len(chunk)
        mask = msgspec.json.decode(b"".join(chunks))["signal_mask"]
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    except (IndexError, ValueError, TypeError, KeyError, OSError, msgspec.DecodeError):
        return  # no hand-over there: the daemon says so (exit 1), signals stay as they are


def handover() -> list[int]:
    """The signals noted since :func:`hold`, in order of first arrival, each at most twice
    (two stop signals hurry; more say nothing new); noting stops."""
    global _noted
    noted, _noted = _noted or {}, None
    return [signum for signum, count in noted.items() for _ in range(min(count, 2))]


class LoopSignals:
    """The loop's handlers for every signal of the table, and the stack dump of ``SIGQUIT``.

    ``SIGQUIT`` also gets :mod:`faulthandler`'s handler, chained in front of the loop's: it
    writes every thread's stack to stderr from the C signal handler, so the dump comes even
    when the loop itself is stuck (the case it is most wanted for); the loop's handler then
    adds the asyncio tasks.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 on_signal: Callable[[int], None]) -> None:
        self._loop = loop
        self._on_signal = on_signal
        #: signal -> its disposition before :meth:`install`
        self._previous: dict[int, Disposition] = {}

    def install(self) -> list[int]:
        """Install the handlers; the signals noted before (see :func:`handover`) to replay."""
        for signum in TABLE:
            self._previous[signum] = signal.getsignal(signum)
            self._loop.add_signal_handler(signum, self._on_signal, signum)
        # fd 2, not sys.stderr: a test's captured stderr may have no descriptor.
        faulthandler.register(signal.SIGQUIT, file=2, all_threads=True, chain=True)
        widen_signal_stack()  # the one faulthandler just set up (see module doc)
        return handover()

    def uninstall(self) -> None:
        """Remove the handlers and put back what was there before (the noting handlers of
        :func:`hold` at the real entry, Python's defaults in a test)."""
        faulthandler.unregister(signal.SIGQUIT)
        for signum, previous in self._previous.items():
            self._loop.remove_signal_handler(signum)
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
