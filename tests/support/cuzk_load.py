"""Work for a cuzk (the stand-in or a real one) over its gRPC ``Prove``, as Curio sends it.

:func:`prove` sends one job and returns how it ended. :class:`Load` keeps sending: ``steady``
(``in_flight`` jobs at all times: the next one goes as soon as one finishes, as Curio does with
a backlog) or ``light`` (one job at a time, ``gap`` seconds of nothing between jobs). Each job is
recorded as a :class:`Sent`; a job whose call broke (the engine died under it) ends ``lost``.

    python tests/support/cuzk_load.py ADDRESS KIND [KIND ...] --steady N | --light GAP --for S
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from cuzkd.cuzk import proving_pb2 as pb

KINDS = {"porep-c2": pb.POREP_SEAL_COMMIT, "snap-update": pb.SNAP_DEALS_UPDATE,
         "window-post": pb.WINDOW_POST_PARTITION, "winning-post": pb.WINNING_POST}
PRIORITIES = {"winning-post": pb.CRITICAL, "window-post": pb.HIGH}
_sectors = itertools.count(1)


def job_id_for(kind: str, miner: int = 1000) -> str:
    """An id in Curio's spelling (PoSt ids carry brackets and spaces)."""
    sector = next(_sectors)
    return {"porep-c2": f"porep-{miner}-{sector}", "snap-update": f"snap-{miner}-{sector}",
            "window-post": f"wdpost-{miner}-[{sector} 0] dl 3",
            "winning-post": f"winning-{miner}-[{sector}]"}[kind]


@dataclass
class Sent:
    job_id: str
    kind: str
    sent: float
    ended: float | None = None
    #: "completed", "failed", "lost" (the call broke) or "" (still waiting)
    outcome: str = ""


async def prove(channel: grpc.aio.Channel, kind: str, job_id: str | None = None) -> Sent:
    """One ``Prove`` call; it returns when the engine answers or the connection breaks."""
    sent = Sent(job_id or job_id_for(kind), kind, time.monotonic())
    call = channel.unary_unary("/cuzk.v1.ProvingEngine/Prove",
                               request_serializer=pb.ProveRequest.SerializeToString,
                               response_deserializer=pb.ProveResponse.FromString)
    request = pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id=sent.job_id, proof_kind=KINDS[kind],
        priority=PRIORITIES.get(kind, pb.NORMAL), sector_size=32 << 30))
    try:
        # wait_for_ready: a job sent while the engine is down waits for it (as Curio retries
        # a refused dial); only a call the engine had and dropped ends "lost"
        reply = await call(request, wait_for_ready=True)
        ok = reply.result.status == pb.AwaitProofResponse.COMPLETED
        sent.outcome = "completed" if ok else "failed"
    except grpc.aio.AioRpcError:
        sent.outcome = "lost"
    sent.ended = time.monotonic()
    return sent


def channel_to(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address)


class Load:
    """Jobs sent to one engine until :meth:`stop`; ``sent`` lists each one."""

    def __init__(self, address: str, kinds: Sequence[str]) -> None:
        self.address = address
        self.kinds = itertools.cycle(kinds)
        self.sent: list[Sent] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        self.channel = channel_to(address)

    def steady(self, in_flight: int) -> None:
        self.tasks += [asyncio.create_task(self._lane(0.0)) for _ in range(in_flight)]

    def light(self, gap: float) -> None:
        self.tasks.append(asyncio.create_task(self._lane(gap)))

    async def _lane(self, gap: float) -> None:
        while not self.stopping:
            kind = next(self.kinds)
            record = Sent(job_id_for(kind), kind, time.monotonic())
            self.sent.append(record)
            done = await prove(self.channel, kind, record.job_id)
            record.ended, record.outcome = done.ended, done.outcome
            if gap:
                await asyncio.sleep(gap)

    async def prove_one(self, kind: str, job_id: str) -> str:
        """One job, recorded like the others; how it ended."""
        sent = await prove(self.channel, kind, job_id)
        self.sent.append(sent)
        return sent.outcome

    def in_flight(self) -> list[Sent]:
        return [s for s in self.sent if not s.outcome]

    async def stop(self) -> None:
        """Send nothing more; cancel the calls still waiting and close the channel."""
        self.stopping = True
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.channel.close()


async def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("address")
    parser.add_argument("kinds", nargs="+", choices=sorted(KINDS))
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--steady", type=int, metavar="N")
    shape.add_argument("--light", type=float, metavar="GAP")
    parser.add_argument("--for", dest="seconds", type=float, default=10.0)
    args = parser.parse_args()
    load = Load(args.address, args.kinds)
    if args.steady:
        load.steady(args.steady)
    else:
        load.light(args.light)
    await asyncio.sleep(args.seconds)
    await load.stop()
    for s in load.sent:
        print(s.job_id, s.kind, s.outcome or "cancelled")


if __name__ == "__main__":
    asyncio.run(_main())
