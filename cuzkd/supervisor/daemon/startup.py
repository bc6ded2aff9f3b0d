"""The supervisor's start-up line: where everything is, as a person would open it.

A newcomer running ``cuzkd run`` in a terminal needs to know what to open next; an operator
reading a journal needs to know which file and socket this process uses. One event,
``supervisor_started``, says both: the metrics and status URLs (clickable, IPv6 bracketed),
the control socket, the config file (or "embedded default") and the engines. The active
release is named only when some engine runs ``{binary}``: without one, releases are noise.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from cuzkd.config import Config, control_socket, state_dir
from cuzkd.config.webconfig import WebConfig

#: A listener on every address is reached from the host itself on loopback (also through a
#: container's published port): that is the URL a person can open.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
#: No ``[metrics] web_config``: plain HTTP, no auth.
_PLAIN = WebConfig()


def http_base(host: str, port: int, scheme: str = "http") -> str:
    """``http://HOST:PORT`` for a bound address; IPv6 hosts in brackets, wildcards as loopback."""
    host = _WILDCARDS.get(host, host)
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def access_of(web: WebConfig) -> str:
    """How the metrics listener is protected, in the start-up line's words."""
    auth = "basic auth" if web.basic_auth_users else "no auth"
    return f"TLS, {auth}" if web.tls else f"plain HTTP, {auth}"


def exposure(host: str, web: WebConfig) -> str | None:
    """Why a listener bound beyond loopback without both TLS and basic auth is a risk, or None
    (``/status`` shows every engine's jobs: miner and sector numbers)."""
    if web.tls and web.basic_auth_users:
        return None
    try:
        if ipaddress.ip_address(host.partition("%")[0]).is_loopback:
            return None
    except ValueError:  # a bound address is an IP; a name is not known to be loopback
        pass
    return (f"metrics.listen is reachable beyond this host ({host}) with {access_of(web)}: "
            "/status shows every engine's jobs. Set [metrics] web_config (TLS and "
            "basic_auth_users) or bind 127.0.0.1")


def startup_fields(config: Config, host: str, port: int,
                   active_release: str | None, web: WebConfig = _PLAIN) -> dict[str, Any]:
    """The fields of ``supervisor_started`` for ``config`` serving metrics on ``host:port``
    with the web config ``web``."""
    base = http_base(host, port, "https" if web.tls else "http")
    fields: dict[str, Any] = {
        "metrics_url": f"{base}/metrics",
        "status_url": f"{base}/status",
        "metrics_access": access_of(web),
        "control_socket": str(control_socket(config)),
        "config": str(Path(config.path).absolute()) if config.path else "embedded default",
        "state_dir": str(state_dir(config)),
        "engines": ", ".join(e.name for e in config.engine),
    }
    if any(e.uses_binary for e in config.engine):
        fields["release"] = active_release or "none (run `cuzkd swap PATH`)"
    if (exposed := exposure(host, web)) is not None:
        fields["metrics_exposed"] = exposed
    return fields
