"""Re-executing cuzkd in place (``cuzkd upgrade``): the dry run, the exec, and the new side's
first steps.

The new program is whatever is installed where this one was started from (a console script,
or ``python -m cuzkd``); it is run twice: first as a dry run -- a one-shot child handed a copy
of the hand-over, which answers whether it can adopt it (:class:`~..core.handover.Verdict`) on
a pipe -- and then by ``execv`` on the main thread, in place, under the same PID.

Around the exec: every descriptor the hand-over names is made inheritable just before it (all
of cuzkd's are close-on-exec otherwise), the hand-over itself is a memfd the new program is
told the number of, and every signal is blocked first -- the mask survives ``execve`` while
the handlers do not, so a ``SIGTERM`` in the gap waits for the new code instead of killing the
supervisor. The new code restores the old mask once its handlers note signals
(:func:`~cuzkd.supervisor.daemon.signalinstall.unblock_after_exec`), and the signals that came
are handled as if during start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import msgspec

from cuzkd.supervisor.core.handover import Verdict
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.supervisor.proc.spawn import memfd_holding

#: The largest verdict a dry run may write (it is a line; more is not a verdict).
MAX_VERDICT = 64 << 10


def launcher(argv0: str) -> list[str]:
    """The command that runs the cuzkd installed where this one was started from: the script
    ``argv0`` (a console script, whose shebang names its interpreter), or this interpreter's
    ``-m cuzkd`` when started so."""
    path = Path(argv0)
    if path.name == "__main__.py" or not path.is_file():
        return [sys.executable, "-m", "cuzkd"]
    return [str(path.absolute())]  # not resolved: a symlink is followed at the exec


def current_signal_mask() -> list[int]:
    """This thread's blocked signals now."""
    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))


def block_signals() -> list[int]:
    """Block every signal (until the exec, and across it); the mask before."""
    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK,
                                                         signal.valid_signals()))


def restore_signals(mask: Sequence[int]) -> None:
    """Put the mask :func:`block_signals` returned back (the exec did not happen): what came
    meanwhile is delivered now."""
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class InstalledProgram:
    """The cuzkd installed where this one was started from: asked in a dry run, then
    executed in place. The upgrade's seam: tests give it a program of their own."""

    def __init__(self, children: ChildTable, command: Sequence[str],
                 exec_args: Sequence[str] = ()) -> None:
        """``command``: runs it (:func:`launcher`); ``exec_args``: ``cuzkd run``'s own options
        the exec keeps (``--log-format``)."""
        self._children = children
        self.command = list(command)
        self._exec_args = list(exec_args)

    @property
    def name(self) -> str:
        return self.command[-1]

    async def check(self, handover: bytes, timeout: float) -> Verdict:
        """Ask ``command run --handover-check`` whether it adopts ``handover`` (its config
        included); a program that cannot run, or answers nothing, is a refusal that says so."""
        try:
            doc = memfd_holding(handover, "cuzkd-handover-check")
        except OSError as exc:  # descriptors or memory short: no dry run, no upgrade
            return Verdict(False, "unknown", f"cannot run the dry run: {exc}")
        try:
            answer_r, answer_w = os.pipe()
        except OSError as exc:
            os.close(doc)
            return Verdict(False, "unknown", f"cannot run the dry run: {exc}")
        said = b""
        try:
            cause = await self._children.run_oneshot(
                [*self.command, "run", "--handover-check", f"{doc}:{answer_w}"], timeout,
                pass_fds=(doc, answer_w))
            os.close(answer_w)
            answer_w = -1
            os.set_blocking(answer_r, False)
            with contextlib.suppress(BlockingIOError):
                said = os.read(answer_r, MAX_VERDICT)
        finally:
            for fd in (doc, answer_r, answer_w):
                if fd >= 0:
                    os.close(fd)
        try:
            return msgspec.json.decode(said, type=Verdict)
        except msgspec.DecodeError:
            return Verdict(False, "unknown",
                           f"{self.name} did not answer the dry run ({cause}): not a cuzkd "
                           "that can take a hand-over (an older one? a downgrade is a restart)")

    def replace(self, handover: bytes, keep: Sequence[int]) -> OSError:
        """Replace this program with ``command run ARGS --handover FD``, ``keep`` open across
        (signals blocked first: :func:`block_signals`); on success it does not return. When
        the exec fails, the descriptors are as they were and the error is returned."""
        if threading.current_thread() is not threading.main_thread():
            # PR_SET_PDEATHSIG fires when the forking thread ends: an exec from another thread
            # ends the main thread, and every engine with it.
            return OSError(0, "cuzkd upgrade execs on the main thread only")
        try:
            doc = memfd_holding(handover, "cuzkd-handover")
        except OSError as exc:  # descriptors or memory short: nothing was changed
            return exc
        kept = [*keep, doc]
        try:
            for fd in kept:
                os.set_inheritable(fd, True)
            os.execv(self.command[0], [*self.command, "run", *self._exec_args,  # noqa: S606
                                       "--handover", str(doc)])
        except OSError as exc:
            for fd in kept:
                with contextlib.suppress(OSError):
                    os.set_inheritable(fd, False)
            os.close(doc)
            return exc
        raise AssertionError("execv returned")  # pragma: no cover


def read_handover(fd: int) -> bytes:
    """The hand-over in the memfd ``fd`` (closed after)."""
    with os.fdopen(fd, "rb") as doc:
        doc.seek(0)
        return doc.read()


def answer_dry_run(fd: int, verdict: Verdict) -> None:
    """Write the dry run's verdict to the pipe ``fd`` the old code reads."""
    with os.fdopen(fd, "wb") as answer:
        answer.write(msgspec.json.encode(verdict))
