"""What ``SIGUSR1`` and ``SIGQUIT`` write to the log (see :mod:`cuzkd.supervisor.core.signals`).

``SIGUSR1``: the supervisor and each engine as ``cuzkd status --json`` shows them, one event
each, for the moment the control socket cannot be reached (it is gone, or the operator has only
``kill`` and the journal). ``SIGQUIT``: the stack of every asyncio task, one event each -- what
the loop is waiting on when something hangs; the threads' stacks come from ``faulthandler``
(:class:`~cuzkd.supervisor.daemon.signalinstall.LoopSignals`). Both only read.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterable
from typing import Any

from cuzkd.supervisor.engines.info import EngineInfo

#: Frames kept per task stack (a deep await chain is cut at its oldest end).
STACK_LIMIT = 40


def log_state(logger: Any, supervisor: dict[str, Any], engines: Iterable[EngineInfo]) -> None:
    """One ``supervisor_state_dumped`` event, then one ``engine_state_dumped`` per engine."""
    logger.info("supervisor_state_dumped", **supervisor)
    for info in engines:
        logger.info("engine_state_dumped", engine=info.name,
                    **{k: v for k, v in info.as_json().items() if k != "name"})


def log_task_stacks(logger: Any, tasks: Iterable[asyncio.Task[Any]]) -> None:
    """One ``task_stack_dumped`` event per task, named by its coroutine."""
    for task in sorted(tasks, key=lambda t: t.get_name()):
        text = io.StringIO()
        task.print_stack(limit=STACK_LIMIT, file=text)
        logger.info("task_stack_dumped", task=task.get_name(), coro=_coro_name(task),
                    stack=text.getvalue())


def _coro_name(task: asyncio.Task[Any]) -> str:
    coro = task.get_coro()
    return str(getattr(coro, "__qualname__", coro))
