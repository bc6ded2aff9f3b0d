"""A real ``cuzkd run`` with one cuzk stand-in engine ``cz`` behind its front door, as the
door's end-to-end tests drive it: the door's address, calls sent as Curio sends them (sync
grpc futures), the engine's own log events, a scrape, the CLI."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

from cuzkd.cuzk import proving_pb2 as pb
from support.cuzk_load import KINDS, PRIORITIES
from support.supervisor_harness import RunningSupervisor

SERVICE = "/cuzk.v1.ProvingEngine/"
MIB = 1 << 20


@dataclass
class Door:
    tmp: Path
    sup: RunningSupervisor
    #: the door's address: the stand-in TOML's [daemon] listen, as Curio dials it
    address: str

    def running(self) -> int:
        """The engine's pid once it runs."""
        return int(self.sup.wait_engine("cz", lambda e: e["state"] == "running",
                                        timeout=30)["pid"])

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address, options=[
            ("grpc.max_send_message_length", 256 * MIB),
            ("grpc.max_receive_message_length", 256 * MIB)])

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the series of ``name`` with ``labels`` in a scrape of cuzkd now."""
        with urllib.request.urlopen(f"http://{self.sup.about()['metrics_listen']}/metrics",
                                    timeout=10) as resp:
            text = resp.read().decode()
        total = 0.0
        for line in text.splitlines():
            series, _, value = line.rpartition(" ")
            if (series == name or series.startswith(name + "{")) and all(f'{k}="{v}"' in series
                                                     for k, v in labels.items()):
                total += float(value)
        return total

    def said(self, what: str, job_id: str) -> bool:
        """The engine logged ``what`` (cuzk's event: ``proof job started``) of ``job_id``."""
        return bool(self.sup.events(what, engine="cz", job_id=job_id))

    def cli(self, *args: str) -> str:
        """``cuzkd ARGS --config`` this supervisor's config: its output."""
        return subprocess.run([sys.executable, "-m", "cuzkd", *args, "--config",
                               str(self.sup.config)], capture_output=True, text=True,
                              check=True, timeout=30).stdout


def prove_request(kind: str, job_id: str) -> pb.ProveRequest:
    """A Prove as Curio sends it: WinningPoSt CRITICAL, WindowPoSt HIGH, the rest NORMAL."""
    return pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id=job_id, proof_kind=KINDS[kind], priority=PRIORITIES.get(kind, pb.NORMAL)))


def prove_later(channel: grpc.Channel, kind: str, job_id: str,
                timeout: float = 60) -> grpc.Future:
    """A ``Prove`` under way (sync grpc's future): its result or its RpcError later."""
    call = channel.unary_unary(SERVICE + "Prove",
                               request_serializer=pb.ProveRequest.SerializeToString,
                               response_deserializer=pb.ProveResponse.FromString)
    return call.future(prove_request(kind, job_id), timeout=timeout)
