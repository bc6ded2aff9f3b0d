"""The work of one partition: witness synthesis, the quotient polynomial, commitments, proof.

This is the arithmetic core of a Groth16 prover's GPU phase, without the elliptic curves:

* **synthesize** (CPU): witness vectors a, b, c of length n = 2^k, derived deterministically
  from (job_id, partition) so any party can recompute them, with a∘b = c -- a satisfied
  rank-1 constraint system evaluated on the subgroup H of size n.
* **prove_device** (the device part, run under the GPU lock): interpolate A, B, C (inverse
  NTT), evaluate them on a coset of size 2n (coset NTT), form (A·B − C)/Z_H pointwise there
  (Z_H = x^n − 1 is non-zero on the coset), interpolate back to get H (inverse coset NTT).
  Because a∘b = c on H, A·B − C vanishes on H and the division is exact, so H has degree < n.
* **finalize** (host, off the device): commit to A, B, C, H by hashing their coefficients,
  derive the challenge r from the commitments (Fiat-Shamir), evaluate all four at r.
* **verify**: recompute r from the commitments and check A(r)·B(r) − C(r) = H(r)·Z_H(r).

An unsatisfied witness makes A·B − C not divisible by Z_H; the "quotient" computed on the coset
is then a different polynomial and the identity fails at r with overwhelming probability.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuzkd.bundled import field
from cuzkd.bundled.field import Array
from cuzkd.bundled.ntt import NttPlan

# Host memory per element of a partition of n elements, phase by phase. Measured with
# tracemalloc (NumPy reports its buffers to it) and kept honest by a test that measures again:
# tests/bundled/test_prover.py::test_reservations_cover_the_measured_working_sets.

#: The witness: a, b, c (uint64 each), from synthesis until the device phase ends.
WITNESS_BYTES_PER_ELEMENT = 3 * 8
#: Extra while synthesizing (x, the random-number buffers and the layers' temporaries),
#: returned when synthesis ends.
SYNTH_SCRATCH_BYTES_PER_ELEMENT = 40
#: The device phase's results: coefficients of A, B, C, H, until finalized.
RESULT_BYTES_PER_ELEMENT = 4 * 8
#: Peak of prove_device on the host backend (NumPy) beyond the witness: the interpolated
#: coefficients, the 2n coset evaluations and every temporary of the transforms, results
#: included (NTT tables excluded: they are counted once, as cached tables).
HOST_DEVICE_PHASE_BYTES_PER_ELEMENT = 288
#: Peak of finalize beyond the results: the powers of r and the products summed.
FINALIZE_BYTES_PER_ELEMENT = 72
#: Most an NTT plan of m elements caches: bit-reversal (8m), twiddles and their inverses (4m
#: each), coset powers and their inverses (8m each). On the host backend only.
TABLE_BYTES_PER_ELEMENT = 32


@dataclass(frozen=True)
class Witness:
    job_id: str
    partition: int
    log_n: int
    #: shape (3, n): rows a, b, c, host uint64 arrays
    abc: np.ndarray[Any, np.dtype[np.uint64]]


@dataclass(frozen=True)
class DeviceResult:
    """Coefficients of A, B, C, H on the host, ready for commitments."""

    job_id: str
    partition: int
    log_n: int
    #: shape (4, n): rows A, B, C, H
    coeffs: np.ndarray[Any, np.dtype[np.uint64]]


@dataclass(frozen=True)
class Proof:
    """What a verifier needs: commitments, the challenge and the four evaluations at it."""

    job_id: str
    partition: int
    log_n: int
    #: hex sha256 of the coefficients of A, B, C, H
    commitments: tuple[str, str, str, str]
    r: int
    #: A(r), B(r), C(r), H(r)
    evaluations: tuple[int, int, int, int]


def _seed(job_id: str, partition: int, log_n: int) -> int:
    digest = hashlib.sha256(f"cuzkd-witness|{job_id}|{partition}|{log_n}".encode()).digest()
    return int.from_bytes(digest[:16], "little")


def synthesize(job_id: str, partition: int, log_n: int, rounds: int = 1) -> Witness:
    """Deterministic satisfied witness: random x, b; a = x after ``rounds - 1`` layers of
    a ← a² + x (a deeper circuit: the CPU cost of cuzk's synthesis); c = a∘b."""
    n = 1 << log_n
    rng = np.random.Generator(np.random.PCG64(_seed(job_id, partition, log_n)))
    abc = np.empty((3, n), dtype=np.uint64)
    x = rng.integers(0, field.P, size=n, dtype=np.uint64)
    abc[1] = rng.integers(0, field.P, size=n, dtype=np.uint64)
    a = x
    for _ in range(rounds - 1):
        a = field.add(field.mul(a, a, np), x, np)
    abc[0] = a
    abc[2] = field.mul(abc[0], abc[1], np)
    return Witness(job_id=job_id, partition=partition, log_n=log_n, abc=abc)


def partition_bytes(log_n: int, host_device: bool = True) -> tuple[int, int]:
    """Host reservation of one partition as (released after synthesis, released once
    finalized): the whole working set of every phase, so the budget bounds the process.

    ``host_device``: the device phase computes in host memory (NumPy); on a GPU only its
    results come back to the host.
    """
    n = 1 << log_n
    device = HOST_DEVICE_PHASE_BYTES_PER_ELEMENT if host_device else RESULT_BYTES_PER_ELEMENT
    after_synthesis = WITNESS_BYTES_PER_ELEMENT + max(
        device, RESULT_BYTES_PER_ELEMENT + FINALIZE_BYTES_PER_ELEMENT)
    return SYNTH_SCRATCH_BYTES_PER_ELEMENT * n, after_synthesis * n


def table_bytes(log_n: int, host_device: bool = True) -> int:
    """Host bytes an NTT plan of 2^log_n caches (none on a GPU: its tables live there)."""
    return TABLE_BYTES_PER_ELEMENT << log_n if host_device else 0


def quotient(abc: Array, small: NttPlan, large: NttPlan) -> Array:
    """Coefficients (3+1, n) of A, B, C and H = (A·B − C)/Z_H from evaluations ``abc``."""
    xp = small.xp
    n = small.n
    coeffs = small.inverse(abc)
    padded = xp.zeros((3, 2 * n), dtype=xp.uint64)
    padded[:, :n] = coeffs
    ext = large.coset_forward(padded)
    numerator = field.sub(field.mul(ext[0], ext[1], xp), ext[2], xp)
    # Z_H(g·ν^i) = g^n·ν^(i·n) − 1 with ν of order 2n: ν^(i·n) = (−1)^i, so two values only.
    g_n = pow(field.GENERATOR, n, field.P)
    z_inv = xp.asarray(
        [field.inv(g_n - 1), field.inv(field.P - g_n - 1)], dtype=xp.uint64
    )
    z_inv_all = xp.tile(z_inv, n)
    h = large.coset_inverse(field.mul(numerator, z_inv_all, xp))
    return xp.concatenate((coeffs, h[None, :n]), axis=0)


def prove_device(witness: Witness, abc: Array, small: NttPlan, large: NttPlan,
                 to_host: Any) -> DeviceResult:
    """The device part: quotient of the uploaded witness ``abc`` (``xp.asarray(witness.abc)``,
    done before taking the device lock), then download. ``small``/``large`` are plans of size
    n and 2n on the chosen backend; ``to_host`` copies a device array to a NumPy array."""
    if small.n != witness.abc.shape[1] or large.n != 2 * small.n:
        raise ValueError("NTT plans do not match the witness size")
    coeffs = quotient(abc, small, large)
    return DeviceResult(job_id=witness.job_id, partition=witness.partition,
                        log_n=witness.log_n, coeffs=np.asarray(to_host(coeffs)))


def evaluate(coeffs: np.ndarray[Any, np.dtype[np.uint64]], x: int) -> list[int]:
    """Evaluate each row of ``coeffs`` at ``x`` with one vector of powers (no Horner loop)."""
    pw = field.powers(x, coeffs.shape[-1], np)
    terms = field.mul(coeffs, pw, np)  # each < 2^31; a row sums below 2^64 for n < 2^33
    return [int(s) % field.P for s in terms.sum(axis=-1, dtype=np.uint64)]


def commit(row: np.ndarray[Any, np.dtype[np.uint64]]) -> str:
    return hashlib.sha256(np.ascontiguousarray(row, dtype="<u8").tobytes()).hexdigest()


def challenge(job_id: str, partition: int, log_n: int, commitments: tuple[str, ...]) -> int:
    """Fiat-Shamir: r from a hash of the statement and the commitments."""
    transcript = "|".join(("cuzkd-challenge", job_id, str(partition), str(log_n), *commitments))
    return int.from_bytes(hashlib.sha256(transcript.encode()).digest(), "little") % field.P


def finalize(result: DeviceResult) -> Proof:
    """Host part of proving: commitments, challenge, evaluations."""
    a, b, c, h = (commit(row) for row in result.coeffs)
    commitments = (a, b, c, h)
    r = challenge(result.job_id, result.partition, result.log_n, commitments)
    ar, br, cr, hr = evaluate(result.coeffs, r)
    return Proof(job_id=result.job_id, partition=result.partition, log_n=result.log_n,
                 commitments=commitments, r=r, evaluations=(ar, br, cr, hr))


def verify(proof: Proof) -> bool:
    """Check the challenge was derived from the commitments and the quotient identity at r."""
    expected_r = challenge(proof.job_id, proof.partition, proof.log_n, proof.commitments)
    if proof.r != expected_r or not all(0 <= v < field.P for v in proof.evaluations):
        return False
    ar, br, cr, hr = proof.evaluations
    z = (pow(proof.r, 1 << proof.log_n, field.P) - 1) % field.P
    return (ar * br - cr) % field.P == hr * z % field.P
