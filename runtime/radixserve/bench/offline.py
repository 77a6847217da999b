"""`radixserve bench offline`: output tokens/s of the engine on a fixed workload, optionally
against transformers and with features ablated, all in one command."""
from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from radixserve.bench.clock import device_sync
from radixserve.bench.phases import StepPhases
from radixserve.bench.workload import BenchRequest
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams
from radixserve.scheduler.scheduler import Scheduler
from radixserve.scheduler.tp import scheduler_group

Sampling = Callable[[BenchRequest], SamplingParams]


def run_scheduler(sched: Scheduler, reqs: list[BenchRequest], uid0: int = 0,
                  json_schema: str | None = None,
                  phases: StepPhases | None = None, sampling: Sampling | None = None,
                  running: list[int] | None = None) -> tuple[float, int]:
    """Feed every request at once and step until all finish: (seconds, output tokens). With
    `json_schema` every request is constrained by it (and ends when its JSON is complete);
    `phases` records each step's kind and time; `sampling` gives each request's parameters
    (default: `output_len` tokens, EOS ignored); `running` receives the running batch's size at
    each step."""
    device_sync(sched.device)
    start = time.perf_counter()
    for i, r in enumerate(reqs):
        sched.add_request(uid0 + i, r.input_ids, sampling(r) if sampling is not None else
                          SamplingParams(max_tokens=r.output_len, ignore_eos=True,
                                         json_schema=json_schema), lora=r.lora)
    produced = 0
    while sched.has_work:
        if phases is not None:
            phases.before_step(sched)
        if running is not None:
            running.append(len(sched.running))
        produced += len(sched.step())
        if phases is not None:
            phases.after_step(sched)
        if failed := sched.take_failures():  # e.g. a --json-schema xgrammar cannot compile
            raise SystemExit(f"bench: request {failed[0].uid - uid0}: {failed[0].message}")
    if phases is not None:
        phases.finish()
    device_sync(sched.device)
    return time.perf_counter() - start, produced


def allreduce_desc() -> str:
    """This rank's all-reduce: symmetric memory (NCCL above its limits) or NCCL alone."""
    from radixserve.distributed import get_comm

    fast = getattr(get_comm(), "fast", None)
    if fast is None:
        return "all-reduce nccl"
    p = fast.policy
    return (f"all-reduce {p.mode}: one-shot <= {p.one_shot_max_bytes // 1024} KiB, "
            f"two-shot <= {p.two_shot_max_bytes // 1024} KiB, else nccl")


def _prefill_graphs(eng) -> str:
    runner = eng.prefill_graphs
    return f"prefill graphs to {runner.max_tokens} tokens" if runner else "prefill graphs off"


def describe(sched: Scheduler) -> str:
    from radixserve.kvcache.kv_dtype import kv_dtype_name

    eng = sched.engine
    tp = f"tp {eng.cfg.tp}, {allreduce_desc()}, " if eng.cfg.tp > 1 else ""
    return (f"{sched.device} {str(eng.dtype).removeprefix('torch.')}, kv {kv_dtype_name(eng.kv_dtype)}, "
            f"{tp}attn {type(eng.attn_backend).__name__}, "
            f"graphs {'on' if eng.graph_runner else 'off'}, {_prefill_graphs(eng)}, "
            f"overlap {'on' if sched.overlap else 'off'}, "
            f"mixed chunk {'on' if sched.cfg.mixed_chunk else 'off'}, "
            f"cache {sched.cfg.cache}, page {eng.page_size}, prefill chunk {sched.prefill_length}, "
            f"kv {sched.cache.num_slots} tokens, admission {sched.cfg.kv_admission}"
            f"{_host_tier(sched)}{_lora(sched)}")


def _host_tier(sched: Scheduler) -> str:
    _, total = sched.cache.host_tokens
    if not total:
        return ""
    return f", host tier {total} tokens ({sched.cfg.hicache_write_policy})"


def _lora(sched: Scheduler) -> str:
    if sched.lora is None:
        return ""
    pool = sched.lora.pool
    return f", LoRA {len(sched.lora.served)} adapters in {pool.num_slots} slots of rank {pool.max_rank}"


def bench_config(
    eng: EngineConfig, sch: SchedulerConfig, reqs: list[BenchRequest], warmup: int,
    report: Callable[[float, str], None] | None = None, json_schema: str | None = None,
    *, warmup_reqs: list[BenchRequest] | None = None, stats: dict[str, float] | None = None,
    phases: bool = False, sampling: Sampling | None = None,
) -> tuple[float, str]:
    """Start a scheduler (a TP group at `eng.tp` > 1), warm it on the first `warmup` requests
    (of `warmup_reqs` when given, else of the workload), then time the whole workload: (output
    tokens/s, what ran). `report` gets the same pair before the scheduler is torn down, so the
    figure is out whatever the teardown does. `stats` receives `prefill_tokens`, the prompt
    tokens computed in the timed region (those not found in the prefix cache), the running
    batch's mean size over its steps (`mean_running`) and its `retractions`. `phases`: print
    where the timed run's time went by kind of step (`bench.phases`) after `report`. `sampling`:
    each request's parameters (`run_scheduler`)."""
    with scheduler_group(eng, sch) as sched:
        if warmup:  # (with a schema, this compiles it: the timed run finds it cached)
            warm = (reqs if warmup_reqs is None else warmup_reqs)[:warmup]
            run_scheduler(sched, warm, uid0=10**9, json_schema=json_schema, sampling=sampling)
        before = sched.stats()
        steps = StepPhases.on(sched.device, sched.engine.kv_bytes_per_token) if phases else None
        running: list[int] = []
        secs, toks = run_scheduler(sched, reqs, json_schema=json_schema, phases=steps,
                                   sampling=sampling, running=running)
        if stats is not None:
            after = sched.stats()
            stats["prefill_tokens"] = after["prefill_tokens"] - before["prefill_tokens"]
            stats["retractions"] = after["retractions"] - before["retractions"]
            stats["mean_running"] = sum(running) / max(1, len(running))
        want = sum(r.output_len for r in reqs)
        assert toks == want or (json_schema is not None and toks <= want), (toks, want)
        desc = describe(sched)
        if json_schema is not None:
            desc += f", every request JSON-schema constrained ({toks} of {want} tokens made)"
        if report is not None:
            report(toks / secs, desc)
        if steps is not None:
            print(steps.table(), flush=True)
        del sched
    gc.collect()  # free the run's memory now, before the next configuration sizes its KV
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return toks / secs, desc
