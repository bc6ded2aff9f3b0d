"""What the live systemd tests install on the machine: cuzkd, its config and the shipped units
(the service and its socket), and the cuzk stand-in for a cuzk engine behind the door.

cuzkd goes where the unit expects it (/usr/local/bin/cuzkd), run by a virtual environment in
/opt/cuzkd whose interpreter is the distribution's Python: the unit's dynamic user must be able
to read every file, and ProtectHome= hides an interpreter or checkout under /root or /home. The
checkout's package and this test run's site-packages are bound in read-only (the engines are
started as ``sys.executable -m cuzkd``, so the environment must find both).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from support.cuzk_standin import SCRIPT as STANDIN
from support.live import parse_exposition
from support.systemd import Payload, boot_payload

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "cuzkd.service"
SOCKET_UNIT = REPO / "systemd" / "cuzkd.socket"
CONFIG_PATH = "/etc/cuzkd/cuzkd.toml"
METRICS = "http://127.0.0.1:9822"
#: Curio's address: cuzkd.socket's ListenStream=, the stand-in's [daemon] listen
DOOR_SOCKET = "/run/curio/cuzk.sock"
_STANDIN_PATH = "/opt/cuzkd-live/cuzk_standin.py"
_CUZK_TOML = "/etc/cuzkd/cuzk.toml"
_HIDDEN = ("/root", "/home", "/run/user")


def engines_config(*names: str, grace: str = "30s", door: str = "") -> str:
    """The unit's config with bundled (CPU) engines ``names``; ``grace``: its shutdown_grace;
    ``door``: lines of a ``[door]`` table."""
    engines = "".join(f'\n[[engine]]\nname = "{name}"\n' for name in names)
    doors = f"\n[door]\n{door}\n" if door else ""
    return (f'[supervisor]\nstate_dir = "/var/lib/cuzkd"\nshutdown_grace = "{grace}"\n\n'
            f'[metrics]\nlisten = "127.0.0.1:9822"\n{doors}{engines}')


def cuzk_engine_table(name: str, synth_secs: float = 0.2) -> str:
    """A cuzk engine (the stand-in, a PoRep C2 in ``synth_secs`` + 0.05 s, a PoSt in 0.2 s)
    behind its door at Curio's address, which cuzkd.socket holds."""
    return (f'\n[[engine]]\nname = "{name}"\ntype = "cuzk"\n'
            f'command = ["/opt/cuzkd/bin/python3", "{_STANDIN_PATH}", "-c", "{_CUZK_TOML}"]\n'
            f'env = {{ CUZK_STANDIN_SYNTH_SECS = "{synth_secs}", CUZK_STANDIN_GPU_SECS = '
            '"0.05" }\nhealth_interval = "100ms"\nstop_timeout = "2s"\ndrain_timeout = "10s"\n')


def machine_python() -> str:
    """An interpreter outside any home directory with this test run's Python ABI."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}",
                  getattr(sys, "_base_executable", sys.executable)]
    for candidate in candidates:
        if Path(candidate).exists() and not candidate.startswith(_HIDDEN):
            return candidate
    raise AssertionError(f"no Python {version} outside a home directory (tried {candidates}); "
                         "the unit's ProtectHome= would hide it")


def cuzkd_payload() -> Payload:
    python = machine_python()
    site = Path(sysconfig.get_paths()["purelib"])
    payload = boot_payload()
    payload.files.update({
        "/etc/systemd/system/cuzkd.service": UNIT.read_bytes(),  # unmodified
        "/etc/systemd/system/cuzkd.socket": SOCKET_UNIT.read_bytes(),  # unmodified
        _STANDIN_PATH: STANDIN.read_bytes(),
        _CUZK_TOML: (f'[daemon]\nlisten = "unix://{DOOR_SOCKET}"\n'
                     'status_listen = "127.0.0.1:9821"\n[memory]\ntotal_budget = "140GiB"\n'),
        CONFIG_PATH: engines_config("alpha", "beta"),
        "/usr/local/bin/cuzkd": ("#!/opt/cuzkd/bin/python3\nimport sys\n\n"
                                 "from cuzkd.cli import main\n\nsys.exit(main())\n"),
        f"/opt/cuzkd/lib/python{sys.version_info.major}.{sys.version_info.minor}"
        "/site-packages/cuzkd-live.pth": "/opt/cuzkd-live/src\n/opt/cuzkd-live/site\n",
    })
    payload.modes["/usr/local/bin/cuzkd"] = 0o755
    payload.venvs.append(("/opt/cuzkd", python))
    payload.binds += [(REPO / "cuzkd", "/opt/cuzkd-live/src/cuzkd"),
                      (site, "/opt/cuzkd-live/site")]
    # A host that ran cuzkd as root has its own /var/lib/cuzkd: the unit starts from none.
    payload.absent += ["/var/lib/cuzkd", "/var/lib/private/cuzkd"]
    return payload


def engine_values(text: str, name: str) -> dict[str, float]:
    """``engine -> value`` of one per-engine series in a scrape."""
    return {dict(labels)["engine"]: value
            for (sample, labels), value in parse_exposition(text).samples.items()
            if sample == name}
