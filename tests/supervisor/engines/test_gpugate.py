"""The GPU memory gate: the pure rule, the wait on a virtual clock, and the runner holding a
real engine's restart until a fake NVML (the GpuView seam) shows its GPU released."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from support.supervisor_harness import scripted_engine, start_supervisor, write_config

from cuzkd.config import parse_config
from cuzkd.errors import GpuViewError
from cuzkd.gpus import NvmlDevice, load_gpu_view
from cuzkd.states import State
from cuzkd.supervisor.core.gpugate import blocker, cuda_env
from cuzkd.supervisor.daemon.root import Supervisor
from cuzkd.supervisor.engines.gpuwait import wait_for_gpus
from cuzkd.supervisor.engines.runner import EngineRunner

GIB = 2**30
UUID0 = "GPU-5f1c7a2e-0b3d-4c8e-9a61-2d4f8e6b1c03"


def device(index: int = 0, *, used: int = 0, total: int = 80 * GIB,
           processes: dict[int, int | None] | None = None) -> NvmlDevice:
    return NvmlDevice(index=index, uuid=UUID0 if index == 0 else f"GPU-{index:08d}",
                      name="NVIDIA H100", memory_used_bytes=used, memory_total_bytes=total,
                      utilization_ratio=0.0, processes=processes or {})


class FakeGpus:
    """A GpuView whose devices the test changes; counts reads, thread-safe (the gate reads
    from a worker thread)."""

    def __init__(self, *devices: NvmlDevice) -> None:
        self._lock = threading.Lock()
        self._devices = list(devices)
        self.reads = 0
        self.failing = False
        self._read = threading.Condition(self._lock)

    def devices(self) -> list[NvmlDevice]:
        with self._lock:
            self.reads += 1
            self._read.notify_all()
            if self.failing:
                raise GpuViewError("NVML: Unknown Error")
            return list(self._devices)

    def set(self, *devices: NvmlDevice) -> None:
        with self._lock:
            self._devices = list(devices)

    async def reads_past(self, count: int) -> None:
        """Return once the gate has read the devices ``count`` more times."""
        def wait() -> None:
            with self._lock:
                target = self.reads + count
                assert self._read.wait_for(lambda: self.reads >= target, timeout=10)

        await asyncio.to_thread(wait)


# -- the rule --------------------------------------------------------------------------------


def test_blocker_names_what_is_missing() -> None:
    held = device(processes={41: 6 * GIB, 99: None})
    assert blocker([held], ["0"], {41, 42}, 0) == (
        "GPU 0 still holds 6.0 GiB of the previous process (pid 41)")
    assert blocker([held], ["0"], {7}, 0) is None  # another program's memory is not ours
    assert blocker([held], [UUID0], {7}, 0) is None  # by UUID too
    assert blocker([held], ["1"], set(), 0) == "GPU '1' not found by NVML"
    full = device(used=75 * GIB)
    assert blocker([full], ["0"], set(), 20 * GIB) == "GPU 0 has 5.0 GiB free, 20.0 GiB needed"
    assert blocker([full], ["0"], set(), 5 * GIB) is None
    assert blocker([device(), device(1, used=80 * GIB)], ["0", "1"], set(), 1) == (
        "GPU 1 has 0 B free, 1 B needed")


def test_cuda_env_pins_in_nvml_order() -> None:
    assert cuda_env(["0", UUID0]) == {"CUDA_VISIBLE_DEVICES": f"0,{UUID0}",
                                      "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_cuzk_keeps_every_gpu_visible_in_nvidia_smi_order() -> None:
    # cuzk's [gpus] devices are nvidia-smi indices: hiding GPUs would renumber them.
    assert cuda_env(["1"], hide_others=False) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


class VirtualTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_wait_passes_once_the_memory_is_released_and_times_out_otherwise() -> None:
    time = VirtualTime()
    states = iter([device(processes={41: GIB})] * 8 + [device()] * 100)

    async def read(view: Any) -> list[NvmlDevice]:
        return [next(states)]

    result = await wait_for_gpus(FakeGpus(), ["0"], {41}, 0, 30.0, read=read, clock=time.clock,
                                 sleep=time.sleep, interval=0.25)
    assert (result.ready, result.waited_seconds, result.reason, result.reads) == (
        True, 2.0, None, 9)
    held = device(processes={41: GIB})

    async def read_held(view: Any) -> list[NvmlDevice]:
        return [held]

    time.now = 0.0
    result = await wait_for_gpus(FakeGpus(), ["0"], {41}, 0, 3.0, read=read_held,
                                 clock=time.clock, sleep=time.sleep, interval=0.25)
    assert not result.ready and result.waited_seconds == 3.0
    assert result.reason == "GPU 0 still holds 1.0 GiB of the previous process (pid 41)"


async def test_an_nvml_error_is_waited_out_then_reported() -> None:
    time = VirtualTime()
    gpus = FakeGpus(device())
    gpus.failing = True
    result = await wait_for_gpus(gpus, ["0"], set(), 0, 1.0, clock=time.clock,
                                 sleep=time.sleep)
    assert (result.ready, result.reason) == (False, "NVML: Unknown Error")


# -- the runner, with real engine processes ----------------------------------------------------


@pytest.fixture
def sup(tmp_path: Path) -> Iterator[Supervisor]:
    gpus = FakeGpus(device())
    config = parse_config({"supervisor": {"state_dir": str(tmp_path / "state")}}, "test")
    supervisor = Supervisor(config, gpu_view=gpus)
    yield supervisor


def runner_for(sup: Supervisor, tmp_path: Path, name: str = "e", **keys: Any) -> EngineRunner:
    raw = {"supervisor": {"state_dir": str(tmp_path / "state")},
           "engine": [scripted_engine(tmp_path, name, gpus=["0"], health_interval="100ms",
                                  backoff_initial="50ms", **keys)]}
    [spec] = parse_config(raw, "test").engine
    return sup.engines.add(spec)


def gpus_of(sup: Supervisor) -> FakeGpus:
    assert isinstance(sup.engines.gpu_view, FakeGpus)
    return sup.engines.gpu_view


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def run_runner(sup: Supervisor, runner: EngineRunner, body: Any) -> None:
    sup.children.install(asyncio.get_running_loop())
    try:
        await body()
    finally:
        await runner.stop()
        await runner.close()
        sup.children.uninstall()


async def test_restart_waits_until_the_dead_engine_releases_its_gpu(sup: Supervisor,
                                                                   tmp_path: Path) -> None:
    runner = runner_for(sup, tmp_path)
    gpus = gpus_of(sup)

    async def body() -> None:
        runner.start()
        assert await runner.wait_for(lambda: runner.state is State.RUNNING, 20)
        first = runner.pid
        assert first is not None
        assert {k: environ(first)[k] for k in cuda_env(["0"])} == cuda_env(["0"])
        gpus.set(device(processes={first: 8 * GIB}))  # its memory outlives it for a while
        os.kill(first, signal.SIGKILL)
        assert await runner.wait_for(lambda: runner.info().waiting_for_gpu, 20)
        await gpus.reads_past(3)
        assert runner.pid is None and runner.info().waiting_for_gpu
        gpus.set(device())  # the driver let go
        assert await runner.wait_for(lambda: runner.pid not in (None, first), 20)
        assert not runner.info().waiting_for_gpu
        assert environ(runner.pid)["CUDA_VISIBLE_DEVICES"] == "0"

    with structlog.testing.capture_logs() as logs:
        await run_runner(sup, runner, body)
    [passed] = [e for e in logs if e["event"] == "gpu_gate_passed"]
    assert passed["waited_seconds"] > 0


async def test_the_gate_gives_up_after_gpu_release_timeout_and_starts_anyway(
        sup: Supervisor, tmp_path: Path) -> None:
    runner = runner_for(sup, tmp_path, gpu_release_timeout="300ms", gpu_memory_needed="10GiB")
    gpus = gpus_of(sup)
    gpus.set(device(used=75 * GIB))  # someone else's memory: only 5 GiB free

    async def body() -> None:
        runner.start()
        assert runner.info().waiting_for_gpu
        assert await runner.wait_for(lambda: runner.pid is not None, 20)

    with structlog.testing.capture_logs() as logs:
        await run_runner(sup, runner, body)
    [timeout] = [e for e in logs if e["event"] == "gpu_gate_timed_out"]
    assert timeout["reason"] == "GPU 0 has 5.0 GiB free, 10.0 GiB needed"
    assert timeout["waited_seconds"] >= 0.3


async def test_free_memory_must_cover_gpu_memory_needed(sup: Supervisor,
                                                        tmp_path: Path) -> None:
    runner = runner_for(sup, tmp_path, gpu_memory_needed="10GiB")
    gpus = gpus_of(sup)
    gpus.set(device(used=75 * GIB))

    async def body() -> None:
        runner.start()
        await gpus.reads_past(3)
        assert runner.pid is None and runner.info().waiting_for_gpu
        gpus.set(device(used=60 * GIB))
        assert await runner.wait_for(lambda: runner.pid is not None, 20)

    await run_runner(sup, runner, body)


async def test_a_stop_while_waiting_drops_the_spawn(sup: Supervisor, tmp_path: Path) -> None:
    runner = runner_for(sup, tmp_path, gpu_memory_needed="10GiB")
    gpus = gpus_of(sup)
    gpus.set(device(used=80 * GIB))

    async def body() -> None:
        runner.start()
        await gpus.reads_past(1)
        await asyncio.wait_for(runner.stop(), 5)
        assert runner.state is State.STOPPED and runner.pid is None
        assert not runner.info().waiting_for_gpu
        reads = gpus.reads
        gpus.set(device())
        runner.start()  # startable again, and the new gate passes at once
        assert await runner.wait_for(lambda: runner.pid is not None, 20)
        assert gpus.reads == reads + 1

    await run_runner(sup, runner, body)


def test_without_nvml_the_gate_is_off_and_says_so_once(tmp_path: Path) -> None:
    if load_gpu_view()[0] is not None:
        pytest.skip("NVML works on this machine: the gate is on")
    config = write_config(tmp_path, [scripted_engine(tmp_path, "a", gpus=["0"]),
                                     scripted_engine(tmp_path, "b", gpus=["GPU-1234abcd"]),
                                     scripted_engine(tmp_path, "c")])
    sup = start_supervisor(config)
    try:
        pid = sup.wait_engine("a", lambda e: e["state"] == "running")["pid"]
        assert environ(pid)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        b = sup.wait_engine("b", lambda e: e["state"] == "running")
        assert environ(b["pid"])["CUDA_VISIBLE_DEVICES"] == "GPU-1234abcd"
        assert sup.request("POST", "/v1/engines/a/restart")[0] == 200
        sup.wait_engine("a", lambda e: e["state"] == "running" and e["pid"] != pid)
        [said] = sup.events("nvml_unavailable")
        assert said["gated_engines"] == ["a", "b"] and said["level"] == "warning"
        assert not sup.events("gpu_gate_passed") and not sup.events("gpu_gate_timed_out")
    finally:
        sup.stop()
