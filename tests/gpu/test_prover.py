"""Proofs made on the GPU verify, and are the very proofs NumPy makes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cuzkd.bundled import prover
from cuzkd.bundled.backend import Backend
from cuzkd.bundled.ntt import NttPlan

pytestmark = pytest.mark.gpu


def _prove(witness: prover.Witness, xp: Any, to_host: Any) -> prover.Proof:
    small, large = NttPlan(witness.log_n, xp), NttPlan(witness.log_n + 1, xp)
    abc = xp.asarray(witness.abc)
    return prover.finalize(prover.prove_device(witness, abc, small, large, to_host))


@pytest.mark.parametrize("log_n", [10, 14, 18, 20])
def test_gpu_proofs_verify_and_match_numpy(cupy_backend: Backend, log_n: int) -> None:
    for partition in range(2):
        witness = prover.synthesize("gpu-check", partition, log_n)
        with cupy_backend.device(0):
            on_gpu = _prove(witness, cupy_backend.xp, cupy_backend.to_host)
        assert prover.verify(on_gpu), (log_n, partition)
        assert on_gpu == _prove(witness, np, np.asarray)


def test_a_tampered_gpu_proof_fails(cupy_backend: Backend) -> None:
    witness = prover.synthesize("gpu-check", 0, 12)
    with cupy_backend.device(0):
        proof = _prove(witness, cupy_backend.xp, cupy_backend.to_host)
    a, b, c, h = proof.evaluations
    bad = prover.Proof(job_id=proof.job_id, partition=proof.partition, log_n=proof.log_n,
                       commitments=proof.commitments, r=proof.r, evaluations=(a, b, c, h + 1))
    assert not prover.verify(bad)
