"""The supervisor daemon (``cuzkd run``), in layers: ``daemon`` (the composition root) over ``web``
(its HTTP faces) over ``engines`` over ``proc`` (OS processes) over ``core`` (pure decisions)."""
