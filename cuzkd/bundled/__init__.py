"""The bundled reference engine: cuzk's pipeline structure doing real BabyBear NTT arithmetic on
CuPy or NumPy. See ``docs/engine.md``; the handlers of ``cuzkd engine`` and ``cuzkd bench``
are in ``cli`` (their arguments in :mod:`cuzkd.cli.engine_commands`)."""
