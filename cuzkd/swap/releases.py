"""The release store: engine binaries installed side by side, switched by one atomic rename.

Replacing a running engine's file in place fails with "Text file busy", and on overlay
filesystems a copy can leave the old file served. So a binary is never written where it might
be executing: each release is a fresh directory ``releases/<id>/<name>`` (``id`` from the
content's sha256), and activating one only renames a new ``current`` symlink over the old one.
Engines are spawned from :meth:`ReleaseStore.active_binary` (the resolved path), so a process
keeps running the exact release it started with whatever happens to ``current`` afterwards.

Every mutating operation exists as a generator (``*_steps``) that yields the name of each
durable step once it is done; the plain methods just run it to the end. Tests drive a
generator in a child process and SIGKILL it after a chosen step, then check that
:meth:`ReleaseStore.recover` finds a consistent store. The step names are the ``*_STEPS``
tuples. See docs/swap.md for the layout and the recovery rules.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import structlog

from cuzkd.errors import HistoryError, ReleaseError
from cuzkd.swap import history, inuse, rules
from cuzkd.swap.fsutil import (
    fsync_dir,
    make_temp_symlink,
    remove_entry,
    replace_durably,
    temp_path,
)
from cuzkd.swap.history import Record, ReleaseOrigin, ReleaseVerdict
from cuzkd.swap.historyfile import HistoryFile

INSTALL_STEPS = ("temp_created", "copied", "sealed", "committed", "stamped")
ACTIVATE_STEPS = ("previous_linked", "previous_flipped", "current_linked", "current_flipped",
                  "stamped")
ROLLBACK_STEPS = ("current_linked", "current_flipped", "previous_linked", "previous_flipped",
                  "stamped")
PRUNE_STEPS = ("detached", "removed")  # once per removed release (pruned or discarded)

_BINARY_MODE = 0o755
_DIR_MODE = 0o755
_COPY_CHUNK = 1 << 20

_log = structlog.get_logger("cuzkd.swap")

T = TypeVar("T")


@dataclass(frozen=True)
class Release:
    id: str
    binary: Path  # state_dir/releases/<id>/<name>, absolute


def run_steps(steps: Generator[str, None, T]) -> T:
    """Run a ``*_steps`` generator to the end and return its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result


class ReleaseStore:
    """Releases under ``state_dir``; one operation at a time (the caller serialises swaps).

    Wide, not deep: its methods are the store's verbs (install, activate, judge, roll back,
    prune, recover, each with its steps) over three attributes, all keeping the same on-disk
    invariants."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir).absolute()
        self._releases = self.state_dir / rules.RELEASES_DIR
        self._history = HistoryFile(self.state_dir / rules.HISTORY_FILE)

    # -- reading -----------------------------------------------------------------------------

    def validate_source(self, path: Path) -> None:
        """Raise ReleaseError unless ``path`` is a regular, executable, non-empty file."""
        fd, _ = _open_source(path)
        os.close(fd)

    def releases(self) -> list[Release]:
        """Complete releases, most recently installed or activated first."""
        try:
            names = [entry.name for entry in self._releases.iterdir()]
        except FileNotFoundError:
            return []
        found = [r for r in map(self._load, filter(rules.is_release_id, names)) if r is not None]
        return sorted(found, key=lambda r: (-_stamp_of(r), r.id))

    def active(self) -> Release | None:
        """The release ``current`` points at; None before the first activation."""
        return self._linked(rules.CURRENT_LINK)

    def previous(self) -> Release | None:
        """The release a rollback would return to, if any."""
        return self._linked(rules.PREVIOUS_LINK)

    def active_binary(self) -> str:
        """Resolved path of the active binary, for argv[0] at every spawn.

        Resolving (rather than spawning ``current/<name>``) pins the release for the process's
        lifetime and makes ``/proc/PID/exe`` name the release directory.
        """
        release = self.active()
        if release is None:
            raise ReleaseError(f"no active release in {self.state_dir}; install one first")
        return os.path.realpath(release.binary)

    def history(self) -> list[Record]:
        """The release history, oldest first (see :mod:`cuzkd.swap.history`)."""
        try:
            return self._history.records()
        except HistoryError as exc:
            raise ReleaseError(str(exc)) from None

    def verdict(self, release: Release) -> Record | None:
        """The history's record of ``release``, if it has one."""
        return history.find(self.history(), release.id)

    def rollback_target(self) -> Release | None:
        """The last accepted release before the active one that is still installed, if any.

        Not ``previous``: after a swap was rolled back, ``previous`` is the release that failed.
        """
        active = self.active()
        installed = {r.id: r for r in self.releases()}
        rid = history.rollback_target(self.history(), _id_of(active), installed)
        return None if rid is None else installed[rid]

    # -- operations --------------------------------------------------------------------------

    def put_in_service(self, release: Release, origin: ReleaseOrigin) -> None:
        """Record that ``release`` is about to be activated for a trial (verdict pending).

        Written before the flip: after a crash in between, recovery finds a pending record that
        is not active and rejects it as interrupted.
        """
        self._save_history(history.put_in_service(
            self.history(), release.id, release.binary.name, origin, time.time()))

    def judge(self, release: Release, verdict: ReleaseVerdict, reason: str | None,
              analysis: dict[str, Any] | None = None) -> None:
        """Record ``verdict`` (and a canary ``analysis``) on ``release`` in the history,
        durably."""
        run_steps(self.judge_steps(release, verdict, reason, analysis))

    def judge_steps(self, release: Release, verdict: ReleaseVerdict, reason: str | None,
                    analysis: dict[str, Any] | None = None) -> Generator[str, None, None]:
        """:meth:`judge`, yielding each step of the history file's ``SAVE_STEPS``."""
        records = history.decide(self.history(), release.id, verdict, reason, time.time(),
                                 analysis)
        yield from self._history.save_steps(self._trimmed(records))

    def recover(self) -> None:
        """Bring the store to a consistent state; run at supervisor start, before any spawn.

        Removes temporary entries left by an interrupted operation; repoints ``current`` to
        ``previous`` if it names no complete release (or removes it if neither is usable);
        drops ``previous`` if unusable, missing its ``current`` or equal to it; discards the
        releases never accepted (see :meth:`_discard_never_accepted`).
        """
        self._ensure_layout()
        for directory in (self.state_dir, self._releases):
            for entry in directory.iterdir():
                if rules.is_temp_name(entry.name):
                    remove_entry(entry)
                    _log.warning("swap_temp_removed", path=str(entry))
            fsync_dir(directory)
        current_text = self._link_text(rules.CURRENT_LINK)
        previous_text = self._link_text(rules.PREVIOUS_LINK)
        current, previous = self._resolve(current_text), self._resolve(previous_text)
        if current is None and current_text is not None:
            if previous is not None:
                _log.warning("swap_current_restored", release=previous.id)
                run_steps(self._flip_steps(rules.CURRENT_LINK, previous))
                current = previous
            else:
                _log.warning("swap_current_removed")
                self._unlink(rules.CURRENT_LINK)
        stale_previous = previous is None or current is None or previous.id == current.id
        if stale_previous and previous_text is not None:
            self._unlink(rules.PREVIOUS_LINK)
        if self._recover_history(current):
            self._discard_never_accepted()

    def install(self, source: Path) -> Release:
        """Copy ``source`` into the store (or reuse the release with the same content)."""
        return run_steps(self.install_steps(source))

    def install_steps(self, source: Path) -> Generator[str, None, Release]:
        """:meth:`install`, yielding each step of :data:`INSTALL_STEPS`.

        Nothing on disk changes when the source is refused. The copy is made from the fd that
        was validated, so the file checked is the file copied.
        """
        src_fd, before = _open_source(source)
        with open(src_fd, "rb") as src:
            self._ensure_layout()
            staging = Path(tempfile.mkdtemp(prefix=rules.TEMP_PREFIX, dir=self._releases))
            try:
                with open(staging / source.name, "xb") as dst:
                    yield "temp_created"
                    digest = _copy(src, dst, before, source)
                    yield "copied"
                    os.fchmod(dst.fileno(), _BINARY_MODE)
                    os.fsync(dst.fileno())
                staging.chmod(_DIR_MODE)
                fsync_dir(staging)
                yield "sealed"
                release = self._commit(staging, rules.release_id(digest), source.name)
            except BaseException:
                remove_entry(staging)
                raise
        yield "committed"
        self._stamp(release)
        yield "stamped"
        _log.info("swap_release_installed", release=release.id, source=str(source))
        return release

    def activate(self, release: Release) -> Release | None:
        """Make ``release`` current; return the release that was active before (or None).

        Activating the active release only refreshes its place in the pruning order.
        """
        return run_steps(self.activate_steps(release))

    def activate_steps(self, release: Release) -> Generator[str, None, Release | None]:
        """:meth:`activate`, yielding each step of :data:`ACTIVATE_STEPS`.

        ``previous`` is flipped first: interrupted between the two flips, the store still runs
        the old release and ``previous`` merely equals it (recovery drops it). The other order
        would leave ``previous`` naming a release older than the one being replaced.
        """
        target = self._require(release)
        old = self.active()
        if old is None or old.id != target.id:
            if old is not None:
                yield from self._flip_steps(rules.PREVIOUS_LINK, old)
            yield from self._flip_steps(rules.CURRENT_LINK, target)
        self._stamp(target)
        yield "stamped"
        _log.info("swap_release_activated", release=target.id,
                  previous=None if old is None else old.id)
        return old

    def rollback(self) -> Release:
        """Make ``previous`` current again (and the replaced release ``previous``)."""
        return run_steps(self.rollback_steps())

    def rollback_steps(self) -> Generator[str, None, Release]:
        """:meth:`rollback`, yielding each step of :data:`ROLLBACK_STEPS`.

        ``current`` is flipped first: interrupted between the flips, the rollback has taken
        effect and ``previous`` equals ``current`` (recovery drops it); the other order could
        lose the rollback target without having rolled back.
        """
        target = self.previous()
        old = self.active()
        if target is None or old is None:
            raise ReleaseError(f"no previous release to roll back to in {self.state_dir}")
        yield from self._flip_steps(rules.CURRENT_LINK, target)
        yield from self._flip_steps(rules.PREVIOUS_LINK, old)
        self._stamp(target)
        yield "stamped"
        _log.info("swap_release_rolled_back", release=target.id, replaced=old.id)
        return target

    def prune(self, keep: int) -> list[Release]:
        """Remove all but the ``keep`` newest releases; return the removed ones.

        Never removes the active release, the previous one, or one a process executes.
        ``keep < 0`` raises ValueError.
        """
        return run_steps(self.prune_steps(keep))

    def prune_steps(self, keep: int) -> Generator[str, None, list[Release]]:
        """:meth:`prune`, yielding :data:`PRUNE_STEPS` for each removed release.

        A release is first renamed to a temporary name (atomically gone from the store), then
        deleted, so an interruption never leaves a half-deleted directory under a release id.
        """
        ordered = self.releases()
        protected = self._pinned(ordered) | history.protected(
            self.history(), _id_of(self.active()), {r.id for r in ordered})
        doomed = set(rules.select_prunable([r.id for r in ordered], keep, protected))
        removed = []
        for release in ordered:
            if release.id not in doomed:
                continue
            yield from self._remove_steps(release)
            removed.append(release)
            _log.info("swap_release_pruned", release=release.id)
        return removed

    def discard(self, release: Release, reason: str) -> bool:
        """Remove ``release``, installed by a swap that was then refused (its smoke test, its
        activation): it would only take the space -- a full disk is often why the swap was
        refused. Kept when it is pinned after all (:meth:`_pinned`); the history is not
        asked: it may be what could not be written, and it keeps only accepted releases,
        which a swap's fresh copy is not. True when removed."""
        if release.id in self._pinned([release]):
            return False
        run_steps(self._remove_steps(release))
        _log.info("swap_release_discarded", release=release.id, reason=reason)
        return True

    # -- internals ---------------------------------------------------------------------------

    def _pinned(self, releases: list[Release]) -> set[str]:
        """Those of ``releases`` no removal may take whatever the history says: the active
        one, the previous one, and any a process executes."""
        pinned = {r.id for r in (self.active(), self.previous()) if r is not None}
        return pinned | _executed_ids(releases, inuse.running_executables())

    def _remove_steps(self, release: Release) -> Generator[str, None, None]:
        """Rename ``release`` to a temporary name (atomically gone from the store), then
        delete it: an interruption never leaves a half-deleted directory under a release id."""
        detached = temp_path(self._releases)
        replace_durably(release.binary.parent, detached)
        yield "detached"
        remove_entry(detached)
        yield "removed"

    def _discard_never_accepted(self) -> None:
        """At start: remove each release the history has no record of, or a ``rejected``
        one, unless pinned (:meth:`_pinned`: active, previous, executed). Every release put
        in service (a swap, ``initial_binary``) has a record from before its activation, so
        one without a record was installed by an operation that stopped before (the
        supervisor died during a smoke test); a rejected one failed its smoke test, its
        activation or its trial, and no rollback goes to it. Either is what a refused swap
        leaves behind when it could not discard it at once."""
        verdicts = {r.release: r.verdict for r in self.history()}
        unused = [r for r in self.releases()
                  if verdicts.get(r.id, ReleaseVerdict.REJECTED) == ReleaseVerdict.REJECTED]
        if not unused:
            return
        pinned = self._pinned(unused)
        for release in unused:
            if release.id not in pinned:
                run_steps(self._remove_steps(release))
                _log.info("swap_release_discarded", release=release.id, reason=(
                    "never accepted: " + (ReleaseVerdict.REJECTED if release.id in verdicts
                                          else "no history record")))

    def _recover_history(self, active: Release | None) -> bool:
        """Make the history agree with ``current``; set an unreadable history aside (then
        False: the new history knows no release, so none may be judged by it).

        An unreadable file is kept under another name for the operator and a new history
        starts: the supervisor still runs, but no release is a rollback target until one has
        been accepted again (guessing one could bring back a release that crashes).
        """
        readable = True
        try:
            records = self._history.records()
        except HistoryError as exc:
            aside = self._history.set_aside()
            _log.error("swap_history_unreadable", error=str(exc), moved_to=str(aside),
                       detail="a new history starts; rollback has no target until a release "
                              "is accepted")
            records, readable = [], False
        reconciled = history.reconcile(records, _id_of(active),
                                       None if active is None else active.binary.name, time.time())
        if reconciled != records:
            self._save_history(reconciled)
        return readable

    def _save_history(self, records: list[Record]) -> None:
        self._history.save(self._trimmed(records))

    def _trimmed(self, records: list[Record]) -> list[Record]:
        return history.trim(records, {r.id for r in self.releases()})

    def _ensure_layout(self) -> None:
        if not self._releases.is_dir():
            self._releases.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
            fsync_dir(self.state_dir)

    def _load(self, rid: str) -> Release | None:
        """The release with id ``rid`` if its directory holds exactly one usable binary."""
        directory = self._releases / rid
        try:
            entries = list(directory.iterdir())
            if len(entries) != 1:
                return None
            st = entries[0].lstat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if rules.binary_problem(st.st_mode, st.st_size) is not None:
            return None
        return Release(rid, entries[0])

    def _require(self, release: Release) -> Release:
        found = self._load(release.id)
        if found is None:
            raise ReleaseError(f"release {release.id} is not installed in {self._releases}")
        return found

    def _commit(self, staging: Path, rid: str, name: str) -> Release:
        """Rename the sealed staging directory to ``releases/<rid>``, or reuse an existing one.

        A release installed earlier from a file of another name keeps its first name.
        """
        existing = self._load(rid)
        if existing is not None:
            remove_entry(staging)
            return existing
        final = self._releases / rid
        try:
            staging.rename(final)
        except OSError as exc:
            raise ReleaseError(
                f"{final} exists but is not a complete release ({exc.strerror}); remove it"
            ) from exc
        fsync_dir(self._releases)
        return Release(rid, final / name)

    def _stamp(self, release: Release) -> None:
        """Mark ``release`` the newest, for pruning order; survives restarts (directory mtime).

        Strictly after every other release even if the clock stepped back or two operations
        share a filesystem timestamp tick.
        """
        newest = max((_stamp_of(r) for r in self.releases()), default=0)
        now = max(time.time_ns(), newest + 1)
        os.utime(release.binary.parent, ns=(now, now))

    def _flip_steps(self, link: str, release: Release) -> Generator[str, None, None]:
        """Atomically point symlink ``link`` at ``release``: never a moment without it."""
        temp = make_temp_symlink(self.state_dir, rules.link_target(release.id))
        yield f"{link}_linked"
        replace_durably(temp, self.state_dir / link)
        yield f"{link}_flipped"

    def _link_text(self, link: str) -> str | None:
        path = self.state_dir / link
        try:
            return str(path.readlink())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise ReleaseError(
                    f"{path} is not a symlink; cuzkd manages this path, move it away"
                ) from exc
            raise

    def _resolve(self, text: str | None) -> Release | None:
        """The complete release a link text names, or None."""
        rid = None if text is None else rules.parse_link_target(text)
        return None if rid is None else self._load(rid)

    def _linked(self, link: str) -> Release | None:
        text = self._link_text(link)
        release = self._resolve(text)
        if release is None and text is not None:
            raise ReleaseError(
                f"{self.state_dir / link} points to {text!r}, which is not a complete release; "
                "run recovery (the supervisor does at start)"
            )
        return release

    def _unlink(self, link: str) -> None:
        (self.state_dir / link).unlink()
        fsync_dir(self.state_dir)


def source_release_id(path: Path) -> str:
    """The release id ``path`` would get if installed (refused like :meth:`ReleaseStore.install`).

    Lets the supervisor tell whether ``initial_binary`` is the active release without installing
    it, which would make it the newest release in the pruning order.
    """
    fd, _ = _open_source(path)
    with open(fd, "rb") as src:
        return rules.release_id(hashlib.file_digest(src, "sha256").hexdigest())


def release_of_pid(pid: int, store: ReleaseStore) -> str | None:
    """The id of the release that process ``pid`` executes, or None (gone, or not a release)."""
    exe = inuse.executable_of(pid)
    if exe is None:
        return None
    return next(iter(_executed_ids(store.releases(), [exe])), None)


def _executed_ids(releases: Iterable[Release], exes: Iterable[inuse.Executable]) -> set[str]:
    identities = [(r.id, inuse.identify(r.binary)) for r in releases]
    running = list(exes)
    return {
        rid
        for rid, ident in identities
        if ident is not None and any(inuse.executes(exe, ident) for exe in running)
    }


def _id_of(release: Release | None) -> str | None:
    return None if release is None else release.id


def _stamp_of(release: Release) -> int:
    return os.lstat(release.binary.parent).st_mtime_ns


def _open_source(path: Path) -> tuple[int, os.stat_result]:
    """Open ``path`` without following a final symlink and check the opened file.

    ``fstat`` on the fd, not ``stat`` on the path: the file cannot be swapped between the check
    and the copy. O_NONBLOCK keeps a FIFO from blocking the open (it is then refused).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{path}: no such file") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReleaseError(f"{path}: is a symlink; give the path of the binary itself") from exc
        raise ReleaseError(f"{path}: cannot open: {exc.strerror}") from exc
    except ValueError as exc:  # a NUL byte: no file can have that name
        raise ReleaseError(f"{str(path)!r}: not a valid path ({exc})") from exc
    st = os.fstat(fd)
    problem = rules.binary_problem(st.st_mode, st.st_size)
    if problem is not None:
        os.close(fd)
        raise ReleaseError(f"{path}: {problem}")
    return fd, st


def _copy(src: BinaryIO, dst: BinaryIO, before: os.stat_result, source: Path) -> str:
    """Copy ``src`` to ``dst``, return the sha256 hex digest; refuse a source being rewritten."""
    digest = hashlib.sha256()
    copied = 0
    while chunk := src.read(_COPY_CHUNK):
        digest.update(chunk)
        dst.write(chunk)
        copied += len(chunk)
    dst.flush()
    after = os.fstat(src.fileno())
    if copied != before.st_size or after.st_mtime_ns != before.st_mtime_ns:
        raise ReleaseError(f"{source}: changed while being copied; retry once it is complete")
    return digest.hexdigest()
