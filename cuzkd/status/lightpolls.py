"""Which health polls decode their status document and which only check that a JSON object
came back (see :mod:`cuzkd.status.client`): pure, fed what each poll found."""

from __future__ import annotations

#: A poll of an engine serving documents with extensions decodes one document in this many.
DECODE_EVERY = 10


class LightPolls:
    """Polls check only the framing while the documents carry extensions and decode, but every
    :data:`DECODE_EVERY`-th poll decodes anyway; plain documents are always decoded (the deriver
    reads each one whole)."""

    def __init__(self) -> None:
        self._light = False
        #: light polls since the last one that decoded
        self._since_decoded = 0

    def checks_only(self) -> bool:
        """The next poll checks only that an object came back."""
        return self._light and self._since_decoded < DECODE_EVERY - 1

    def checked(self) -> None:
        """A poll checked its body's framing, which held."""
        self._since_decoded += 1

    def decoded(self, extensions: bool) -> None:
        """A document decoded; ``extensions``: it carried ``cuzkd_extensions``."""
        self._light = extensions
        self._since_decoded = 0

    def broken(self) -> None:
        """A body failed its check or its decode: the following polls decode whole, until a
        document with extensions decodes again."""
        self._light = False
