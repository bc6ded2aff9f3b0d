"""Curio proving one job after another through an address, in a thread, without
``wait_for_ready``: a refused connect or a refused call fails its call at once, so a handover
that is not seamless shows as an outcome other than ``COMPLETED``. ``kind`` says what it
proves (PoRep C2 by default; a ``winning-post`` caller sends CRITICAL, as Curio does) and
``every`` how long it waits between calls."""

from __future__ import annotations

import threading
import time

import grpc

from cuzkd.cuzk import proving_pb2 as pb
from support.cuzk_load import KINDS, PRIORITIES


class Caller(threading.Thread):
    def __init__(self, address: str, kind: str = "porep-c2", every: float = 0.0) -> None:
        super().__init__(daemon=True)
        self._address = address
        self._kind = kind
        self._every = every
        #: each call's result status, or its gRPC code and message
        self.outcomes: list[str] = []
        #: when each call was sent and answered (monotonic)
        self.spans: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self._address) as channel:
            prove = channel.unary_unary(
                "/cuzk.v1.ProvingEngine/Prove",
                request_serializer=pb.ProveRequest.SerializeToString,
                response_deserializer=pb.ProveResponse.FromString)
            n = 0
            while not self.halt.is_set():
                n += 1
                request = pb.ProveRequest(submit=pb.SubmitProofRequest(
                    request_id=f"{self._kind}-1000-{n}", proof_kind=KINDS[self._kind],
                    priority=PRIORITIES.get(self._kind, pb.NORMAL)))
                sent = time.monotonic()
                try:
                    reply = prove(request, timeout=60)
                    self.outcomes.append(pb.AwaitProofResponse.Status.Name(reply.result.status))
                except grpc.RpcError as exc:
                    self.outcomes.append(f"{exc.code().name}: {exc.details()}")
                self.spans.append((sent, time.monotonic()))
                self.halt.wait(self._every)

    def completed(self) -> int:
        return self.outcomes.count("COMPLETED")

    def finish(self) -> None:
        """Send nothing more; wait for the call under way."""
        self.halt.set()
        if self.is_alive():
            self.join(60)

    def spanned(self, moment: float) -> bool:
        """Some call was sent before ``moment`` and answered after it."""
        return any(sent < moment < ended for sent, ended in self.spans)
