"""Start a tensor-parallel scheduler group: followers in spawned processes, the leader here."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing as mp
import os
import tempfile
import time
from collections.abc import Iterator

from radixserve.config import EngineConfig, SchedulerConfig

logger = logging.getLogger(__name__)


def validate_tp(tp: int, hf_config) -> None:
    """Clear errors before any process starts."""
    heads, kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
    if heads % tp:
        raise ValueError(f"--tp {tp} must divide the model's {heads} attention heads")
    if kv % tp and tp % kv:
        raise ValueError(f"--tp {tp} must divide the model's {kv} KV heads or be a multiple of them")
    inter = getattr(hf_config, "moe_intermediate_size", None) or hf_config.intermediate_size
    if inter % tp:
        raise ValueError(f"--tp {tp} must divide the intermediate size {inter}")


def rank_device(spec: str, rank: int) -> str:
    import torch

    if spec in ("auto", "cuda") and torch.cuda.is_available():
        if torch.cuda.device_count() <= rank:
            raise ValueError(f"tensor parallel rank {rank} needs GPU {rank}, but only "
                             f"{torch.cuda.device_count()} are visible")
        return f"cuda:{rank}"
    return "cpu" if spec == "auto" else spec


def join_rank(rank: int, eng: EngineConfig, init_method: str) -> EngineConfig:
    import torch

    from radixserve.distributed.torch_comm import init_tp
    from radixserve.utils.stack_dump import enable_stack_dumps

    enable_stack_dumps(f"tp{rank}")
    eng = dataclasses.replace(eng, device=rank_device(eng.device, rank))
    init_tp(rank, eng.tp, init_method, torch.device(eng.device))
    return eng


def follower_main(rank: int, eng: EngineConfig, sched: SchedulerConfig, init_method: str) -> None:
    from radixserve.scheduler.scheduler import Scheduler
    from radixserve.scheduler.tp import follower_loop

    logging.basicConfig(level=os.environ.get("RADIXSERVE_LOG_LEVEL", "INFO"),
                        format=f"[tp{rank}] %(levelname)s %(name)s: %(message)s")
    time.sleep(float(os.environ.get("RADIXSERVE_TP_FOLLOWER_DELAY_S", "0")))  # tests: a late rank
    sched_r = Scheduler(join_rank(rank, eng, init_method), sched)
    logging.getLogger(__name__).info("tensor-parallel rank %d ready (pid %d)", rank, os.getpid())
    follower_loop(sched_r)


def start_followers(eng: EngineConfig, sched: SchedulerConfig) -> tuple[str, list[mp.Process]]:
    """Spawn ranks 1..tp-1; returns the rendezvous address for rank 0 and the processes. The
    rendezvous folder is removed at exit (`remove_rendezvous`)."""
    from transformers import AutoConfig

    from radixserve.models.default_model import resolve_model_path

    path = resolve_model_path(eng.model)
    validate_tp(eng.tp, AutoConfig.from_pretrained(path))
    eng = dataclasses.replace(eng, model=str(path))
    init_method = "file://" + os.path.join(tempfile.mkdtemp(prefix="radixserve-tp-"), "rendezvous")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=follower_main, args=(r, eng, sched, init_method), daemon=True,
                         name=f"radixserve-tp{r}") for r in range(1, eng.tp)]
    for p in procs:
        p.start()
    return init_method, procs


def start_leader(eng: EngineConfig, sched: SchedulerConfig, init_method: str,
                 followers: list | None = None):
    from radixserve.models.default_model import resolve_model_path
    from radixserve.scheduler.scheduler import Scheduler
    from radixserve.scheduler.tp import TPLeader

    eng = dataclasses.replace(eng, model=str(resolve_model_path(eng.model)))
    return TPLeader(Scheduler(join_rank(0, eng, init_method), sched), followers)


def remove_rendezvous(init_method: str) -> None:
    import shutil

    shutil.rmtree(os.path.dirname(init_method.removeprefix("file://")), ignore_errors=True)


def _reap(followers: list, init_method: str, grace_s: float) -> None:
    """Wait up to `grace_s` for each follower to exit, kill the rest, leave the TP group and
    remove the rendezvous."""
    from radixserve.distributed.torch_comm import shutdown_tp

    for p in followers:
        p.join(timeout=grace_s)
        if p.is_alive():
            p.kill()
            p.join()
    shutdown_tp()
    remove_rendezvous(init_method)


def stop_group(leader, followers: list, init_method: str) -> None:
    """Tell the followers to exit (if all are alive), then reap them: the teardown of
    `start_group`."""
    try:
        if all(p.is_alive() for p in followers):
            leader.shutdown()
    finally:
        _reap(followers, init_method, grace_s=30)


def start_group(eng: EngineConfig, sched: SchedulerConfig):
    """Spawn the followers and start the leader here: (leader, followers, rendezvous). If the
    leader cannot start (a group that never forms, a bad model), the followers are stopped before
    the error propagates."""
    init_method, followers = start_followers(eng, sched)
    try:
        return start_leader(eng, sched, init_method, followers), followers, init_method
    except BaseException:
        _reap(followers, init_method, grace_s=0)  # nothing to tell them: the leader never came up
        raise


@contextlib.contextmanager
def scheduler_group(eng: EngineConfig, sched: SchedulerConfig) -> Iterator:
    """A scheduler for `eng.tp` ranks, torn down on exit: in this process at TP=1; else followers
    spawned on GPUs 1..N-1 and the leader (`TPLeader`, the `Scheduler` interface) here."""
    if eng.tp == 1:
        from radixserve.scheduler.scheduler import Scheduler

        yield Scheduler(eng, sched)
        return
    leader, followers, init_method = start_group(eng, sched)
    try:
        yield leader
    finally:
        stop_group(leader, followers, init_method)
