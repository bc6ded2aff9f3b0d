"""A GET run by a Python inside another namespace (a machine's network, a container).

The live systemd and container tests reach listeners that exist only in a private network
namespace; they run this script there (``nsenter -n python -c``, ``podman exec python3 -c``) and
parse what it prints. Standard library only: it runs on whatever Python the target has.
"""

from __future__ import annotations

GET_SCRIPT = """\
import sys, urllib.error, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))
    code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
except OSError as e:
    code, body = 0, str(e).encode()
sys.stdout.write(f"{code}\\n" + body.decode("utf-8", "replace"))
"""


def parse_get_output(stdout: str) -> tuple[int, str]:
    """(HTTP status, body); status 0 when the connection itself failed (body says why)."""
    code, _, body = stdout.partition("\n")
    return int(code), body
