"""BabyBear field arithmetic on ``uint64`` arrays, for NumPy and CuPy alike.

p = 15·2^27 + 1 is a 31-bit prime, so the product of two reduced elements is below 2^62 and
fits in ``uint64``: a multiplication is one array product followed by ``%``. That is what lets
one implementation serve both backends -- every function takes the array module ``xp``
(``numpy`` or ``cupy``) explicitly, and none of them loops over elements in Python.

The two-adicity of 27 gives power-of-two evaluation domains up to 2^27, far beyond the sizes
the engine proves, and 31 generates the whole multiplicative group, so it also serves as the
coset shift (a non-residue of every power-of-two subgroup).
"""

from __future__ import annotations

from typing import Any

#: The BabyBear prime.
P = 15 * 2**27 + 1
#: Largest k such that 2^k divides p - 1.
TWO_ADICITY = 27
#: A generator of the multiplicative group (p - 1 = 2^27 · 3 · 5).
GENERATOR = 31

#: Array module type: ``numpy`` or ``cupy`` (typed loosely: CuPy ships no stubs).
ArrayModule = Any
#: A ``uint64`` array of reduced field elements on the host or the device.
Array = Any


def root_of_unity(log_n: int) -> int:
    """A primitive 2^log_n-th root of unity."""
    if not 0 <= log_n <= TWO_ADICITY:
        raise ValueError(f"no 2^{log_n}-th roots of unity in BabyBear (max 2^{TWO_ADICITY})")
    return pow(GENERATOR, (P - 1) >> log_n, P)


def inv(x: int) -> int:
    """Multiplicative inverse of a non-zero scalar (Fermat)."""
    if x % P == 0:
        raise ZeroDivisionError("0 has no inverse in BabyBear")
    return pow(x, P - 2, P)


def mul(a: Array, b: Array | int, xp: ArrayModule) -> Array:
    """Elementwise a·b mod p (``b`` may be a scalar below p)."""
    return xp.multiply(a, xp.uint64(b) if isinstance(b, int) else b) % xp.uint64(P)


def add(a: Array, b: Array, xp: ArrayModule) -> Array:
    return (a + b) % xp.uint64(P)


def sub(a: Array, b: Array, xp: ArrayModule) -> Array:
    return (a + (xp.uint64(P) - b)) % xp.uint64(P)


def powers(base: int, count: int, xp: ArrayModule) -> Array:
    """[1, base, base², …, base^(count-1)] mod p, by doubling: log2(count) vector products
    instead of ``count`` scalar ones."""
    out = xp.ones(1, dtype=xp.uint64)
    step = base % P
    while out.shape[0] < count:
        out = xp.concatenate((out, mul(out, step, xp)))
        step = step * step % P
    return out[:count]
