"""Proving and verification: honest proofs verify, every tampering is caught."""

from __future__ import annotations

import dataclasses
import tracemalloc

import numpy as np
import pytest

from cuzkd.bundled import field, prover
from cuzkd.bundled.ntt import NttPlan


def prove(witness: prover.Witness) -> prover.Proof:
    small, large = NttPlan(witness.log_n, np), NttPlan(witness.log_n + 1, np)
    result = prover.prove_device(witness, witness.abc, small, large, np.asarray)
    return prover.finalize(result)


@pytest.mark.parametrize("log_n", [2, 3, 6, 10])
def test_honest_proofs_verify(log_n: int) -> None:
    for partition in range(3):
        assert prover.verify(prove(prover.synthesize("job-a", partition, log_n)))


def test_witness_is_satisfied_and_deterministic() -> None:
    w = prover.synthesize("job-a", 3, 8)
    assert w.abc.shape == (3, 256)
    assert (field.mul(w.abc[0], w.abc[1], np) == w.abc[2]).all()
    assert np.array_equal(w.abc, prover.synthesize("job-a", 3, 8).abc)
    assert not np.array_equal(w.abc, prover.synthesize("job-a", 4, 8).abc)


def test_deeper_synthesis_is_satisfied_deterministic_and_verifies() -> None:
    """More rounds cost more CPU and give another witness, still a∘b = c; rounds=1 is the
    plain witness."""
    deep = prover.synthesize("job-d", 1, 6, rounds=20)
    assert (field.mul(deep.abc[0], deep.abc[1], np) == deep.abc[2]).all()
    assert np.array_equal(deep.abc, prover.synthesize("job-d", 1, 6, rounds=20).abc)
    assert not np.array_equal(deep.abc[0], prover.synthesize("job-d", 1, 6, rounds=19).abc[0])
    assert np.array_equal(prover.synthesize("job-d", 1, 6, rounds=1).abc,
                          prover.synthesize("job-d", 1, 6).abc)
    assert prover.verify(prove(deep))


def test_quotient_is_exact() -> None:
    """H has degree < n − 1 and A·B − C = H·Z_H holds at points off the domain."""
    w = prover.synthesize("job-q", 0, 5)
    result = prover.prove_device(w, w.abc, NttPlan(5, np), NttPlan(6, np), np.asarray)
    a, h = result.coeffs[0], result.coeffs[3]
    assert int(h[-1]) == 0
    for x in (2, 12345, field.P - 3):
        av, bv, cv, hv = prover.evaluate(result.coeffs, x)
        assert (av * bv - cv) % field.P == hv * (pow(x, 32, field.P) - 1) % field.P
    # evaluate() agrees with Horner's rule
    horner = 0
    for coeff in reversed(a.tolist()):
        horner = (horner * 7 + coeff) % field.P
    assert prover.evaluate(result.coeffs, 7)[0] == horner


def test_unsatisfied_witness_fails_verification() -> None:
    w = prover.synthesize("job-bad", 0, 6)
    abc = w.abc.copy()
    abc[2, 5] = (abc[2, 5] + 1) % field.P  # one violated constraint
    assert not prover.verify(prove(dataclasses.replace(w, abc=abc)))


@pytest.mark.parametrize("tamper", [
    lambda p: dataclasses.replace(p, evaluations=(p.evaluations[0] ^ 1, *p.evaluations[1:])),
    lambda p: dataclasses.replace(p, evaluations=(*p.evaluations[:3], (p.evaluations[3] + 1)
                                                  % field.P)),
    lambda p: dataclasses.replace(p, commitments=("00" * 32, *p.commitments[1:])),
    lambda p: dataclasses.replace(p, r=(p.r + 1) % field.P),
    lambda p: dataclasses.replace(p, partition=p.partition + 1),
    lambda p: dataclasses.replace(p, log_n=p.log_n + 1),
    lambda p: dataclasses.replace(p, evaluations=(*p.evaluations[:3], field.P)),
], ids=["eval_a", "eval_h", "commitment", "challenge", "statement", "size", "unreduced"])
def test_tampered_proof_fails(tamper: object) -> None:
    proof = prove(prover.synthesize("job-t", 1, 6))
    assert prover.verify(proof)
    assert callable(tamper)
    assert not prover.verify(tamper(proof))


def test_partition_bytes_two_phases() -> None:
    synth, rest = prover.partition_bytes(10)
    assert synth == 40 * 1024  # synthesis scratch
    assert rest == (24 + 288) * 1024  # witness + the host device phase's working set
    # On a GPU only the results (and finalize's working set) are host memory.
    assert prover.partition_bytes(10, host_device=False)[1] == (24 + 32 + 72) * 1024
    assert prover.table_bytes(10) == 32 * 1024 and prover.table_bytes(10, False) == 0


def test_reservations_cover_the_measured_working_sets() -> None:
    """Each phase's peak host memory (NumPy reports its buffers to tracemalloc) fits what the
    budget reserves for it, and the reservation is not far above it either."""
    log_n = 16
    n = 1 << log_n
    small, large = NttPlan(log_n, np), NttPlan(log_n + 1, np)
    warm = prover.synthesize("warm", 0, log_n)
    prover.prove_device(warm, warm.abc, small, large, np.asarray)  # builds the cached tables
    assert (small.table_bytes + small.coset_bytes + large.table_bytes + large.coset_bytes
            <= prover.table_bytes(log_n) + prover.table_bytes(log_n + 1))
    synth, rest = prover.partition_bytes(log_n)
    tracemalloc.start()
    try:
        synth_peaks = []
        witness = None
        for rounds in (150, 1):  # the demo's deep synthesis, then the default
            witness = None  # the previous witness is not part of this synthesis
            tracemalloc.reset_peak()
            witness = prover.synthesize("j", 0, log_n, rounds)
            synth_peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.reset_peak()
        result = prover.prove_device(witness, witness.abc, small, large, np.asarray)
        device_peak = tracemalloc.get_traced_memory()[1]
        del witness, warm
        tracemalloc.reset_peak()
        prover.finalize(result)
        finalize_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    held = max(device_peak, finalize_peak)  # from synthesis end until finalized
    during_synthesis = synth + prover.WITNESS_BYTES_PER_ELEMENT * n
    fixed = 64 * 1024  # per call, not per element: NumPy's Generator and array objects
    assert max(synth_peaks) <= during_synthesis + fixed
    assert held <= rest + fixed
    assert 0.95 * during_synthesis <= max(synth_peaks) and 0.95 * rest <= held  # not padded
