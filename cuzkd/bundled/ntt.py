"""Number-theoretic transforms over BabyBear: iterative radix-2, one vector operation per stage.

Layout: the input is permuted to bit-reversed order, then log2(n) Cooley-Tukey stages run; the
stage with half-width h views the array as ``(..., n/2h, 2, h)`` and applies every butterfly
of the stage in one vectorised step. The twiddles of every stage are strided views of one
precomputed table of n/2 powers of ω_n, so a plan costs O(n) memory and nothing per call.
The leading axes are a batch: A, B and C are transformed together as one ``(3, n)`` array.

Forward maps coefficients to evaluations on {ω^i}; inverse maps back; the coset variants
evaluate on {g·ω^i} (g = the field generator), where the vanishing polynomial x^n − 1 of the
subgroup has no roots and can be divided by.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from cuzkd.bundled import field
from cuzkd.bundled.field import Array, ArrayModule


@dataclass(frozen=True)
class NttPlan:
    """Precomputed tables for transforms of size ``n = 2^log_n`` on one array module."""

    log_n: int
    xp: ArrayModule

    @property
    def n(self) -> int:
        return 1 << self.log_n

    @cached_property
    def bitrev(self) -> Array:
        idx = np.arange(self.n, dtype=np.uint64)
        rev = np.zeros(self.n, dtype=np.uint64)
        for bit in range(self.log_n):
            rev |= ((idx >> np.uint64(bit)) & np.uint64(1)) << np.uint64(self.log_n - 1 - bit)
        return self.xp.asarray(rev.astype(np.int64))

    @cached_property
    def twiddles(self) -> Array:
        return field.powers(field.root_of_unity(self.log_n), self.n // 2, self.xp)

    @cached_property
    def inverse_twiddles(self) -> Array:
        return field.powers(field.inv(field.root_of_unity(self.log_n)), self.n // 2, self.xp)

    @cached_property
    def coset_powers(self) -> Array:
        return field.powers(field.GENERATOR, self.n, self.xp)

    @cached_property
    def inverse_coset_powers(self) -> Array:
        return field.powers(field.inv(field.GENERATOR), self.n, self.xp)

    @property
    def table_bytes(self) -> int:
        """Bytes of the twiddle tables built so far (what the engine reports as ``srs``)."""
        names = ("bitrev", "twiddles", "inverse_twiddles")
        return sum(int(self.__dict__[name].nbytes) for name in names if name in self.__dict__)

    @property
    def coset_bytes(self) -> int:
        """Bytes of the coset power tables built so far (reported as ``pce``)."""
        names = ("coset_powers", "inverse_coset_powers")
        return sum(int(self.__dict__[name].nbytes) for name in names if name in self.__dict__)

    def _transform(self, values: Array, table: Array) -> Array:
        xp = self.xp
        n = self.n
        if values.shape[-1] != n:
            raise ValueError(f"expected length {n} on the last axis, got {values.shape[-1]}")
        batch = values.shape[:-1]
        x = xp.ascontiguousarray(values[..., self.bitrev])
        half = 1
        while half < n:
            view = x.reshape(*batch, n // (2 * half), 2, half)
            tw = table[:: n // (2 * half)]
            u = view[..., 0, :]
            v = field.mul(view[..., 1, :], tw, xp)
            x = xp.stack((field.add(u, v, xp), field.sub(u, v, xp)), axis=-2).reshape(*batch, n)
            half *= 2
        return x

    def forward(self, coeffs: Array) -> Array:
        """Evaluations of the polynomial(s) ``coeffs`` at ω^0 … ω^(n-1)."""
        return self._transform(coeffs, self.twiddles)

    def inverse(self, evals: Array) -> Array:
        """Coefficients of the polynomial(s) taking the values ``evals`` on the subgroup."""
        return field.mul(self._transform(evals, self.inverse_twiddles), field.inv(self.n), self.xp)

    def coset_forward(self, coeffs: Array) -> Array:
        """Evaluations at g·ω^i: scale coefficient i by g^i, then transform."""
        return self.forward(field.mul(coeffs, self.coset_powers, self.xp))

    def coset_inverse(self, evals: Array) -> Array:
        """Coefficients of the polynomial(s) taking the values ``evals`` at g·ω^i."""
        return field.mul(self.inverse(evals), self.inverse_coset_powers, self.xp)


def naive_dft(coeffs: list[int], root: int) -> list[int]:
    """O(n²) reference transform with Python integers, for tests and cross-checks."""
    n = len(coeffs)
    return [
        sum(c * pow(root, i * j, field.P) for j, c in enumerate(coeffs)) % field.P
        for i in range(n)
    ]
