"""The bundled reference engine: cuzk's pipeline structure doing real BabyBear NTT arithmetic on
CuPy or NumPy. See ``docs/engine.md``; ``cuzkd engine`` and ``cuzkd bench`` live in ``cli``."""
