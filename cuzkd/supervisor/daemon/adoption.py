"""The new program's side of ``cuzkd upgrade``, before its event loop: the dry run's answer, and
the hand-over taken with the config it runs.

The dry run (``cuzkd run --handover-check DOC:ANSWER``) is asked by the old code before anything
changes: it decodes the hand-over (its format) and reads the config text the old code runs,
exactly as the exec's program will, and answers on the pipe. The exec's program
(``cuzkd run --handover FD``) does the same and then runs the supervisor on what it was handed
(:class:`~cuzkd.supervisor.daemon.root.Supervisor`). The config is the text that ran, not the
file as it is now: a changed file is applied by a reload afterwards, as any change is.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from cuzkd import __version__
from cuzkd.config import Config, config_from_text, default_config
from cuzkd.errors import ConfigError, HandoverRefused
from cuzkd.supervisor.core.handover import Handover, Verdict, decode
from cuzkd.supervisor.door.channel import VERSION as CHANNEL_VERSION
from cuzkd.supervisor.proc.reexec import answer_dry_run, read_handover


@dataclass(frozen=True)
class Taken:
    """A hand-over this program adopts, and the config it runs."""

    handed: Handover
    config: Config


def adoptable(handed: Handover) -> Config:
    """The config this program runs for ``handed``; ConfigError or HandoverRefused when it
    cannot take it over."""
    door = handed.door
    if door is not None and door.channel_version != CHANNEL_VERSION:
        # the door process runs on with the old code: it could never talk to this one
        raise HandoverRefused(
            f"the running door process speaks channel version {door.channel_version}, this "
            f"cuzkd {CHANNEL_VERSION}: a restart (systemctl restart cuzkd) replaces both")
    # the config the old code ran, read from its text (the embedded default without one)
    if handed.config_text is None:
        return default_config()
    return config_from_text(handed.config_text, handed.config_path or "the handed config")


def check_handover(fds: str) -> int:
    """``--handover-check DOC:ANSWER``: answer whether this program adopts the hand-over in
    the memfd DOC; 0 when it does, else 1 (the reason on the pipe and on stderr)."""
    doc, _, answer = fds.partition(":")
    if not (doc.isdigit() and answer.isdigit()):
        raise HandoverRefused(f"--handover-check {fds!r}: expected DOC:ANSWER, two descriptors")
    try:
        adoptable(decode(_read(int(doc))))
    except (HandoverRefused, ConfigError) as exc:
        print(f"cuzkd {__version__} refuses the hand-over: {exc}", file=sys.stderr)
        verdict = Verdict(False, __version__, str(exc))
    else:
        verdict = Verdict(True, __version__)
    try:
        answer_dry_run(int(answer), verdict)
    except OSError as exc:
        raise HandoverRefused(f"cannot answer on descriptor {answer}: {exc.strerror}") \
            from None
    return 0 if verdict.ok else 1


def take_handover(fd: int) -> Taken:
    """``--handover FD``: the hand-over and its config. Raises what the dry run would have
    refused (it passed: only a file changed since, such as a web config, gets here)."""
    handed = decode(_read(fd))
    return Taken(handed, adoptable(handed))


def _read(fd: int) -> bytes:
    """The hand-over in ``fd``; HandoverRefused when there is none to read there."""
    try:
        return read_handover(fd)
    except OSError as exc:
        raise HandoverRefused(f"no hand-over to read in descriptor {fd}: {exc.strerror}") \
            from None
