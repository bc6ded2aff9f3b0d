"""What an engine's status documents say: each decoded with its odd values left out, counted
and logged, and each plain cuzk document fed to the deriver that rebuilds its extensions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import Extensions, StaleJob, StatusDecoder, StatusDocument
from cuzkd.status.salvage import FieldErrorReason


class StatusReader:
    """Decodes one engine's documents and derives the extensions of plain ones."""

    def __init__(self, log: Any, deriver: Callable[[], ExtensionDeriver]) -> None:
        """``log``: the logger for field errors and deriver failures; ``deriver`` makes the
        deriver of plain documents (and a fresh one after it failed)."""
        self._log = log
        self._new_deriver = deriver
        self._deriver = deriver()
        self._decoder = StatusDecoder()
        #: reason -> values left out of the decoded documents
        self.field_errors_total: Counter[FieldErrorReason] = Counter()
        #: the last decoded document's field errors (Decoded.left_out); None when clean
        self.field_errors: str | None = None
        #: field errors repeat with every document: one line per 10 s
        self._limited = LimitedLog()

    def decode(self, data: bytes) -> StatusDocument:
        """Decode a body, counting and logging the values left out of it; StatusDecodeError
        when it is no status document."""
        decoded = self._decoder.decode(data)
        self.field_errors = decoded.left_out()
        if decoded.field_errors:
            self.field_errors_total.update(decoded.field_error_counts)
            reasons = {str(why): n for why, n in decoded.field_error_counts.items()}
            self._limited.log(self._log, "warning", "engine_status_fields_left_out",
                              errors=self.field_errors, reasons=reasons)
        return decoded.document

    def derive(self, document: StatusDocument) -> None:
        """Feed the deriver; a failure of it starts it afresh (its counters reset, as at an
        engine restart) rather than failing the poll of an engine that answered."""
        try:
            self._deriver.observe(document)
        except Exception:
            self._deriver = self._new_deriver()
            self._limited.log(self._log, "error", "status_derive_failed", exc_info=True)

    def derived(self) -> Extensions:
        """The extensions derived from the plain documents seen so far."""
        return self._deriver.extensions()

    def failed_work(self) -> tuple[list[StaleJob], list[int]]:
        """The stale jobs and phantom-busy workers found in the last plain document."""
        return self._deriver.stale_jobs(), self._deriver.phantom_busy_workers()
