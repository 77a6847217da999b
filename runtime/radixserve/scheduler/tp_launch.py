"""Start and stop a tensor-parallel scheduler group: followers in spawned processes
(`tp_ranks.py`), the leader here (`tp.py`)."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

from radixserve import settings
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.scheduler.rendezvous import new_rendezvous, remove_rendezvous

logger = logging.getLogger(__name__)


def validate_tp(tp: int, hf_config) -> None:
    """Clear errors before any process starts. `hf_config`: a transformers config or
    config.json's fields (a multimodal one's `text_config` is read)."""
    from radixserve.models.hf_config import text_config

    hf_config = text_config(hf_config)
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


def _exit_when_orphaned(rank: int, leader_pid: int) -> None:
    """A follower outlives its leader only by a killed leader: leave instead of waiting in a
    collective (NCCL would wait for the group's timeout)."""
    def run() -> None:
        while os.getppid() == leader_pid:
            time.sleep(1.0)
        logging.getLogger(__name__).error("tensor-parallel rank %d: the leader (pid %d) is gone; "
                                          "exiting", rank, leader_pid)
        os._exit(1)

    threading.Thread(target=run, name="orphan-watch", daemon=True).start()


def follower_main(rank: int, eng: EngineConfig, sched: SchedulerConfig, init_method: str,
                  pipe) -> None:
    """A follower rank's process: tell rank 0 it is joining, join, serve the leader's commands,
    leave the group with the others; a start that fails is reported to rank 0 through `pipe`."""
    from radixserve.distributed.torch_comm import shutdown_tp
    from radixserve.logs import setup_logging
    from radixserve.scheduler.scheduler import Scheduler
    from radixserve.scheduler.tp import LeaderLost, follower_loop, release_cuda_graphs
    from radixserve.scheduler.tp_ranks import FAILED, JOINING

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group; rank 0 decides
    setup_logging(f"tp{rank}")
    log = logging.getLogger(__name__)
    _exit_when_orphaned(rank, os.getppid())
    try:
        time.sleep(settings.TP_FOLLOWER_DELAY_S.get())  # tests: a late rank
        if settings.TP_FOLLOWER_FAIL.is_set():  # tests: a rank whose start fails
            raise RuntimeError(settings.TP_FOLLOWER_FAIL.get())
        pipe.send_bytes(JOINING)
        sched_r = Scheduler(join_rank(rank, eng, init_method), sched)
    except BaseException as e:
        with contextlib.suppress(OSError):
            pipe.send_bytes(FAILED + f"{type(e).__name__}: {e}".encode())
        raise
    log.info("tensor-parallel rank %d ready (pid %d)", rank, os.getpid())
    try:
        follower_loop(sched_r)
    except LeaderLost as e:  # the leader died mid-exchange: one line, not a traceback
        log.error("tensor-parallel rank %d: lost the leader (%s); exiting", rank, e)
        sys.exit(1)
    release_cuda_graphs(sched_r)
    shutdown_tp()
    log.info("tensor-parallel rank %d left the group", rank)


def _prepare(eng: EngineConfig) -> tuple[EngineConfig, str]:
    """Check `--tp` against the model (before any process starts); a fresh rendezvous path."""
    from transformers import AutoConfig

    from radixserve.models.default_model import resolve_model_path

    path = resolve_model_path(eng.model)
    validate_tp(eng.tp, AutoConfig.from_pretrained(path))
    return dataclasses.replace(eng, model=str(path)), new_rendezvous()


def start_group(eng: EngineConfig, sched: SchedulerConfig):
    """Spawn ranks 1..tp-1 and start rank 0 here; returns rank 0 as a `TPLeader`, whose
    `close()` tears the group down. A rank that dies or fails while starting raises
    `RuntimeError` naming it, as does a group that does not form within the init timeout; the
    other ranks are stopped and the rendezvous removed before the error propagates."""
    from radixserve.distributed.torch_comm import abort_tp, init_timeout_s, shutdown_tp
    from radixserve.scheduler.scheduler import Scheduler
    from radixserve.scheduler.tp import TPLeader
    from radixserve.scheduler.tp_ranks import RankProcesses

    eng, init_method = _prepare(eng)
    limit = init_timeout_s()
    ranks = RankProcesses(follower_main, lambda r: (r, eng, sched, init_method), eng.tp)
    try:
        ranks.wait_joining(limit)
        ranks.watch(lambda line: (logger.error("%s", line), abort_tp()))
        try:
            sched0 = Scheduler(join_rank(0, eng, init_method), sched)
        except Exception as e:
            if (dead := ranks.dead()) is not None:
                raise RuntimeError(f"{dead} while starting; the group cannot form") from e
            raise
        return TPLeader(sched0, ranks, init_method)
    except BaseException:
        shutdown_tp(abort=True, timeout_s=5)
        ranks.reap(grace_s=0)  # nothing to tell them: the group never formed
        remove_rendezvous(init_method)
        raise


@contextlib.contextmanager
def scheduler_group(eng: EngineConfig, sched: SchedulerConfig) -> Iterator:
    """A scheduler for `eng.tp` ranks, torn down on exit: in this process at TP=1; else followers
    spawned on GPUs 1..N-1 and the leader (`TPLeader`, the `Scheduler` interface) here."""
    if eng.tp == 1:
        from radixserve.scheduler.scheduler import Scheduler

        yield Scheduler(eng, sched)
        return
    leader = start_group(eng, sched)
    try:
        yield leader
    finally:
        leader.close()
