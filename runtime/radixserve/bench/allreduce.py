"""All-reduce latency across the GPUs of one host: what tensor parallelism adds to each decode
step (two all-reduces per layer: after attention and after the MLP). Each rank captures a run of
all-reduces of a bf16 [bs, hidden] tensor in a CUDA graph and times its replays, as decode runs,
so the figure is device time without launch overhead."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class AllReduceBench:
    tp: int
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    hidden: int = 5120  # Qwen3-14B
    layers: int = 40
    per_graph: int = 32  # all-reduces captured in one graph
    replays: int = 20

    def __post_init__(self) -> None:
        if self.tp < 2:
            raise ValueError(f"tp must be at least 2, got {self.tp}")
        for name in ("hidden", "layers", "per_graph", "replays"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ValueError(f"batch_sizes must be positive, got {list(self.batch_sizes)}")


def require_devices(tp: int) -> None:
    import torch

    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < tp:
        raise RuntimeError(f"--tp {tp} needs >= {tp} CUDA devices (NCCL), found {found}")


def _time_us(bench: AllReduceBench, bs: int, device) -> float:
    """Microseconds per all-reduce, from CUDA-graph replays on this rank."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(bs, bench.hidden, dtype=torch.bfloat16, device=device)  # zeros never overflow
    dist.all_reduce(x)  # eager first: the communicator is set up outside the capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(bench.per_graph):
            dist.all_reduce(x)
    graph.replay()  # warm-up, and lines the ranks up before the timed replays
    torch.cuda.synchronize(device)
    dist.all_reduce(x)
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(bench.replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (bench.replays * bench.per_graph)


def _rank_main(rank: int, bench: AllReduceBench, init_method: str) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=bench.tp,
                            device_id=device)
    try:
        if rank == 0:
            print(f"all-reduce, bf16, hidden {bench.hidden}, {bench.tp} GPUs "
                  f"({torch.cuda.get_device_name(device)}), CUDA graphs; decode step = "
                  f"2 x {bench.layers} layers", flush=True)
            print(f"{'batch':>6} {'KiB':>8} {'us/all-reduce':>14} {'busbw GB/s':>11} "
                  f"{'us/decode step':>15}", flush=True)
        for bs in bench.batch_sizes:
            us = _time_us(bench, bs, device)
            if rank == 0:
                size = bs * bench.hidden * 2
                busbw = 2 * (bench.tp - 1) / bench.tp * size / us / 1e3  # as nccl-tests reports
                print(f"{bs:>6} {size / 1024:>8.0f} {us:>14.2f} {busbw:>11.1f} "
                      f"{2 * bench.layers * us:>15.1f}", flush=True)
    finally:
        dist.destroy_process_group()


def run_allreduce_bench(bench: AllReduceBench) -> None:
    """Spawn one process per GPU; rank 0 prints the table. RuntimeError without enough GPUs."""
    require_devices(bench.tp)
    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast, as torch_comm (see docs)
    folder = tempfile.mkdtemp(prefix="radixserve-allreduce-")
    try:
        mp.spawn(_rank_main, args=(bench, "file://" + os.path.join(folder, "rendezvous")),
                 nprocs=bench.tp, join=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
