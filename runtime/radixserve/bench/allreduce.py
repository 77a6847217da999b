"""All-reduce latency across the GPUs of one host: what tensor parallelism adds to each decode
step (two all-reduces per layer: after attention and after the MLP). Each rank captures a run of
all-reduces of a bf16 [bs, hidden] tensor in a CUDA graph and times its replays, as decode runs,
so the figure is device time without launch overhead. Each implementation (NCCL, the
symmetric-memory one-shot and two-shot kernels, and "auto", the engine's choice) is first checked
to give the exact sum."""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from radixserve import settings

IMPLS = ("nccl", "one_shot", "two_shot", "auto")


@dataclass(frozen=True)
class AllReduceBench:
    tp: int
    batch_sizes: tuple[int, ...] = (1, 8, 64, 256)
    hidden: int = 5120  # Qwen3-14B
    layers: int = 40
    per_graph: int = 32  # all-reduces captured in one graph
    replays: int = 20
    impls: tuple[str, ...] = ("nccl",)

    def __post_init__(self) -> None:
        bad = [i for i in self.impls if i not in IMPLS]
        if bad or not self.impls:
            raise ValueError(f"impls must be among {', '.join(IMPLS)}, got {list(self.impls)}")
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


def _run_one(x, impl: str, fast) -> None:
    """One all-reduce of `x` the way `impl` says ("auto": as the engine picks)."""
    import torch.distributed as dist

    from radixserve.distributed.allreduce_choice import NCCL, is_aligned

    kind = impl
    if impl == "auto":
        kind = fast.policy.pick(x.numel() * x.element_size(), x.dtype, is_aligned(x), True) if fast else NCCL
    if kind == NCCL:
        dist.all_reduce(x)
    else:
        fast.all_reduce(x, kind)


def _check_sum(bench: AllReduceBench, bs: int, impl: str, fast, rank: int, device) -> bool:
    """Eager all-reduce of small integers (exact in bf16) against the sum computed here."""
    import torch

    base = (torch.arange(bs * bench.hidden, device=device) % 7).view(bs, bench.hidden)
    x = (base + rank).to(torch.bfloat16)
    _run_one(x, impl, fast)
    want = (base * bench.tp + sum(range(bench.tp))).to(torch.bfloat16)
    return bool(torch.equal(x, want))


def _time_us(bench: AllReduceBench, bs: int, impl: str, fast, device) -> float:
    """Microseconds per all-reduce, from CUDA-graph replays on this rank."""
    import torch
    import torch.distributed as dist

    x = torch.zeros(bs, bench.hidden, dtype=torch.bfloat16, device=device)  # zeros never overflow
    _run_one(x, impl, fast)  # eager first: the communicator is set up outside the capture
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(bench.per_graph):
            _run_one(x, impl, fast)
    graph.replay()  # warm-up, and lines the ranks up before the timed replays
    torch.cuda.synchronize(device)
    dist.all_reduce(torch.zeros(1, device=device))
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(bench.replays):
        graph.replay()
    end.record()
    end.synchronize()
    us = start.elapsed_time(end) * 1000 / (bench.replays * bench.per_graph)
    del graph
    return us


def _make_fast(bench: AllReduceBench, rank: int, device, init_method: str):
    """The engine's symmetric-memory all-reduce, with a buffer for the largest batch here; None
    (and the reason on rank 0) where PyTorch cannot make it."""
    import torch.distributed as dist

    from radixserve.distributed.allreduce_choice import AllReducePolicy, policy_from_env
    from radixserve.distributed.symm_allreduce import SymmAllReduce

    need = max(bench.batch_sizes) * bench.hidden * 2
    engine = policy_from_env() if settings.ALLREDUCE.is_set() else AllReducePolicy()
    policy = AllReducePolicy("auto", engine.one_shot_max_bytes, engine.two_shot_max_bytes,
                             max(need, engine.buffer_bytes))
    try:
        return SymmAllReduce(policy, rank, bench.tp, device, dist.group.WORLD.group_name), policy
    except Exception as e:  # noqa: BLE001 -- reported; the NCCL column still runs
        if rank == 0:
            print(f"symmetric memory unavailable: {type(e).__name__}: {e}", flush=True)
        return None, policy


def _rank_main(rank: int, bench: AllReduceBench, init_method: str) -> None:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=bench.tp,
                            device_id=device)
    try:
        fast, policy = (_make_fast(bench, rank, device, init_method)
                        if set(bench.impls) - {"nccl"} else (None, None))
        impls = [i for i in bench.impls if i == "nccl" or fast is not None]
        if rank == 0:
            print(f"all-reduce, bf16, hidden {bench.hidden}, {bench.tp} GPUs "
                  f"({torch.cuda.get_device_name(device)}), CUDA graphs; decode step = "
                  f"2 x {bench.layers} layers; torch {torch.__version__}", flush=True)
            if policy is not None:
                print(f"auto: one-shot up to {policy.one_shot_max_bytes // 1024} KiB, two-shot up to "
                      f"{policy.two_shot_max_bytes // 1024} KiB, else NCCL", flush=True)
            cols = "".join(f"{i + ' us':>13}" for i in impls)
            print(f"{'batch':>6} {'KiB':>8}{cols} {'best':>9} {'us/step best':>13} {'sums':>5}",
                  flush=True)
        for bs in bench.batch_sizes:
            ok = all(_check_sum(bench, bs, i, fast, rank, device) for i in impls)
            times = {i: _time_us(bench, bs, i, fast, device) for i in impls}
            if rank == 0:
                best = min(times, key=times.get)
                cells = "".join(f"{times[i]:>13.2f}" for i in impls)
                print(f"{bs:>6} {bs * bench.hidden * 2 / 1024:>8.0f}{cells} {best:>9} "
                      f"{2 * bench.layers * times[best]:>13.1f} {'ok' if ok else 'WRONG':>5}",
                      flush=True)
            if not ok:
                raise RuntimeError(f"rank {rank}: an all-reduce gave a wrong sum at batch {bs}")
        del fast
    finally:
        dist.destroy_process_group()


def run_allreduce_bench(bench: AllReduceBench) -> None:
    """Spawn one process per GPU; rank 0 prints the table. RuntimeError without enough GPUs."""
    require_devices(bench.tp)
    import torch.multiprocessing as mp

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # no NVLink multicast, as torch_comm (see docs)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    folder = tempfile.mkdtemp(prefix="radixserve-allreduce-")
    try:
        mp.spawn(_rank_main, args=(bench, "file://" + os.path.join(folder, "rendezvous")),
                 nprocs=bench.tp, join=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
