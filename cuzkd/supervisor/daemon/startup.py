"""The supervisor's start-up line: where everything is, as a person would open it.

A newcomer running ``cuzkd run`` in a terminal needs to know what to open next; an operator
reading a journal needs to know which file and socket this process uses. One event,
``supervisor_started``, says both: the metrics and status URLs (clickable, IPv6 bracketed),
the control socket, the config file (or "embedded default") and the engines. The active
release is named only when some engine runs ``{binary}``: without one, releases are noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuzkd.config import Config

#: A listener on every address is reached from the host itself on loopback (also through a
#: container's published port): that is the URL a person can open.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def http_base(host: str, port: int) -> str:
    """``http://HOST:PORT`` for a bound address; IPv6 hosts in brackets, wildcards as loopback."""
    host = _WILDCARDS.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def startup_fields(config: Config, host: str, port: int,
                   active_release: str | None) -> dict[str, Any]:
    """The fields of ``supervisor_started`` for ``config`` serving metrics on ``host:port``."""
    base = http_base(host, port)
    fields: dict[str, Any] = {
        "metrics_url": f"{base}/metrics",
        "status_url": f"{base}/status",
        "control_socket": str(config.control_socket),
        "config": str(Path(config.path).absolute()) if config.path else "embedded default",
        "state_dir": str(config.state_dir),
        "engines": ", ".join(e.name for e in config.engine),
    }
    if any(e.uses_binary for e in config.engine):
        fields["release"] = active_release or "none (run `cuzkd swap PATH`)"
    return fields
