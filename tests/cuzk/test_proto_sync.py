"""The committed ``proving_pb2`` modules are what grpcio-tools makes of ``proving.proto`` today,
and the ``.proto`` keeps cuzk's wire numbers (the facts of cuzk's own ``proving.proto``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cuzkd.cuzk import proving_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("cuzkd/cuzk/proving_pb2.py", "cuzkd/cuzk/proving_pb2.pyi")


def test_committed_modules_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run([str(ROOT / "scripts" / "gen-cuzk-proto.sh"), str(tmp_path)], check=True,
                   env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    for name in GENERATED:
        assert (tmp_path / name).read_bytes() == (ROOT / name).read_bytes(), (
            f"{name} is stale: run scripts/gen-cuzk-proto.sh")


def test_wire_numbers_are_cuzks() -> None:
    fields = {message: {f.name: f.number for f in pb.DESCRIPTOR.message_types_by_name[
        message].fields} for message in ("SubmitProofRequest", "GetStatusResponse",
                                         "QueueStatus", "AwaitProofResponse")}
    assert fields["SubmitProofRequest"] == {
        "request_id": 1, "proof_kind": 2, "sector_size": 3, "registered_proof": 4,
        "priority": 5, "vanilla_proof": 10, "vanilla_proofs": 11, "sector_number": 20,
        "miner_id": 21, "randomness": 22, "partition_index": 23, "comm_r_old": 30,
        "comm_r_new": 31, "comm_d_new": 32}
    assert fields["GetStatusResponse"] == {
        "gpus": 1, "loaded_srs": 2, "queues": 3, "total_proofs_completed": 4,
        "total_proofs_failed": 5, "uptime_seconds": 6, "pinned_memory_bytes": 7,
        "pinned_memory_limit_bytes": 8}
    assert fields["QueueStatus"] == {"proof_kind": 1, "pending": 2, "in_progress": 3}
    assert fields["AwaitProofResponse"]["total_ms"] == 14
    assert pb.DESCRIPTOR.package == "cuzk.v1"
    assert [m.name for m in pb.DESCRIPTOR.services_by_name["ProvingEngine"].methods] == [
        "SubmitProof", "AwaitProof", "Prove", "CancelProof", "GetStatus", "GetMetrics",
        "PreloadSRS", "EvictSRS"]
    assert pb.WINNING_POST == 4 and pb.CRITICAL == 4
