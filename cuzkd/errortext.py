"""Error messages that always say something.

``str(TimeoutError())`` is empty, and so is the message of many ``asyncio`` and ``aiohttp``
exceptions: formatted as ``f"{type(exc).__name__}: {exc}"`` or ``f"...: {exc}"`` they printed as
``TimeoutError: `` or a bare colon, which tells an operator nothing. Every place that turns an
exception into text for a log field, an API answer or a CLI line goes through
:func:`error_text`.
"""

from __future__ import annotations


def error_text(exc: BaseException) -> str:
    """``Type: message``, or the type alone when the message is empty."""
    text = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name
