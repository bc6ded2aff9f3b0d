"""Terminal escape sequences and control characters removed from an engine's text.

cuzk logs with ANSI colours whatever it writes to (``\\x1b[32m INFO\\x1b[0m``); re-logged as
is, every level and target of its lines would carry escape codes into journald, Loki and the
JSON log, and a console log shown on a terminal would obey whatever sequences an engine wrote
(move the cursor, retitle the window, hide text). :func:`strip_controls` removes the ECMA-48
sequences -- CSI (``ESC [`` ... final byte), the string commands OSC, DCS, SOS, PM and APC up
to their terminator (BEL or ``ESC \\``; an unterminated one runs to the end of the text), and
the two-byte escapes -- with their 8-bit C1 forms, then every C0 and C1 control character
left but tab. Linear in the text: no pattern here can backtrack.
"""

from __future__ import annotations

import re

_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI: parameters, intermediates, final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # strings
    r"|\x1b[ -/]*[0-~]"  # the other escapes (ESC 7, ESC (B, ...)
)
#: What is left to remove: C0 controls but tab, DEL, C1 controls (a lone ESC among them).
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def strip_controls(text: str) -> str:
    """``text`` without escape sequences and control characters (tab kept)."""
    if _CONTROL.search(text) is None:  # the usual line: nothing to do
        return text
    return _CONTROL.sub("", _SEQUENCE.sub("", text))
