"""One way to say what is wrong in a document msgspec refused: ``FILE: key `a.b`: message``.

The supervisor's config, the engine's config and the release history are all validated by
msgspec, whose errors read "Expected `int`, got `str` - at `$.engine[1].x`". Operators get the
same shape from each -- the file, the key by its dotted path, what is wrong -- from here.
"""

from __future__ import annotations

import re

import msgspec

_PATH_RE = re.compile(r"^(?P<msg>.*) - at `\$\.?(?P<path>[^`]*)`$", re.DOTALL)
_UNKNOWN_RE = re.compile(r"^Object contains unknown field `(?P<field>[^`]*)`$")


def key_and_message(exc: msgspec.DecodeError | str) -> tuple[str, str]:
    """(dotted key, message) of a msgspec error; the key is "" for the document as a whole.
    An unknown field is named as the key, with the message ``unknown key``."""
    match = _PATH_RE.match(str(exc))
    msg, path = (match.group("msg"), match.group("path")) if match else (str(exc), "")
    unknown = _UNKNOWN_RE.match(msg)
    if unknown:
        path = f"{path}.{unknown.group('field')}" if path else unknown.group("field")
        msg = "unknown key"
    return path, msg.replace("`", "")


def key_error(where: str, key: str, message: str) -> str:
    """``where: key `key`: message`` (``where: message`` without a key)."""
    return f"{where}: key `{key}`: {message}" if key else f"{where}: {message}"


def describe(exc: msgspec.DecodeError | str, where: str, prefix: str = "") -> str:
    """The message for a msgspec error in the document ``where``; ``prefix``: the table the
    validated part sits in (``engine_defaults``)."""
    path, msg = key_and_message(exc)
    if prefix:
        path = f"{prefix}.{path}" if path else prefix
    return key_error(where, path, msg)
