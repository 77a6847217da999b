"""The host KV tier on CUDA: its copies on their own streams (pinned host pages in runs, device
pages scattered, bf16/fp8, page sizes 1 and 16) bring back exactly what was written, ordered by
events only; and the scheduler with the tier and optimistic admission under a small pool (CUDA
graphs, overlap, loads waited for layer by layer) gives the tokens of an unconstrained run, on
one GPU and at TP 2 (each rank its shard)."""
from __future__ import annotations

import pytest
import torch

from radixserve.kvcache.hiradix import CopyOrder
from radixserve.kvcache.host_pool import HostKVPool
from radixserve.kvcache.kv_dtype import FP8_KV_DTYPE
from radixserve.kvcache.pool import MHAKVPool
from radixserve.kvcache.radix import RadixNode
from radixserve.scheduler.host_tier import HostTier
from tests.runtime.test_retraction import POOL, run_checked, tokens, workload

pytestmark = pytest.mark.gpu


def _pools(dtype: torch.dtype, page_size: int, pages: int):
    dev = torch.device("cuda")
    pool = MHAKVPool(3, pages, page_size, 2, 64, dtype, dev)
    for layer in range(3):
        for cache in (pool.k_cache(layer), pool.v_cache(layer)):
            cache.copy_(torch.randn(cache.shape, device=dev).to(dtype))
    host = HostKVPool(3, pages, page_size, 2, 64, dtype, pinned=True)
    return pool, HostTier(pool, host, dev)


def _slots(pages: torch.Tensor, page_size: int, device: str) -> torch.Tensor:
    return (pages[:, None] * page_size + torch.arange(page_size)).reshape(-1).to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8_KV_DTYPE])
@pytest.mark.parametrize("page_size", [1, 16])
def test_backup_then_load_brings_back_the_same_bytes(dtype, page_size) -> None:
    pool, tier = _pools(dtype, page_size, 64)
    gen = torch.Generator().manual_seed(0)
    src = torch.randperm(64, generator=gen)[:24]  # scattered device pages
    host_pages = torch.cat([torch.arange(0, 10), torch.arange(20, 34)])  # two runs
    node = RadixNode((), None, None, 0)
    dev_src, host_slots = _slots(src, page_size, "cuda"), _slots(host_pages, page_size, "cpu")
    want = [(pool.k_cache(i)[dev_src].clone(), pool.v_cache(i)[dev_src].clone()) for i in range(3)]
    tier.after_launch([CopyOrder(dev_src, host_slots, node)])  # the write stream, behind compute
    assert node.host_ready is not None  # what a load of these host pages waits for
    dst = torch.tensor([p for p in range(64) if p not in set(src.tolist())][:24])
    dev_dst = _slots(dst, page_size, "cuda")
    ready = tier.before_launch([CopyOrder(dev_dst, host_slots, node)])
    assert ready is not None and len(ready.events) == 3
    for layer in range(3):  # the compute stream waits layer by layer, as attention does
        ready.wait(layer)
        got_k, got_v = pool.k_cache(layer)[dev_dst], pool.v_cache(layer)[dev_dst]
        assert torch.equal(got_k.view(torch.uint8), want[layer][0].view(torch.uint8))
        assert torch.equal(got_v.view(torch.uint8), want[layer][1].view(torch.uint8))
    assert tier.loaded_tokens == tier.written_tokens == 24 * page_size


# (page sizes at which this workload's shared prefixes are evicted and matched again: its system
# prompt is 24 tokens; the copies of 16-token pages are the test above's)
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("policy", ["write_through", "write_back"])
def test_scheduler_with_the_tier_under_pressure_keeps_the_tokens(tiny_ckpts, page_size, policy) -> None:
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    reqs = workload()

    def sched(kv: int | None, **kw) -> Scheduler:
        eng = EngineConfig(model=str(tiny_ckpts["llama"]), dtype="float32", device="cuda",
                           page_size=page_size, max_kv_tokens=kv, attn="triton")
        return Scheduler(eng, SchedulerConfig(max_running_requests=16, **kw))

    ref = tokens(run_checked(sched(None, kv_admission="reserve"), {0: list(range(len(reqs)))},
                             {}, reqs))
    s = sched(POOL, schedule_conservativeness=0.05, enable_hierarchical_cache=True,
              hicache_write_policy=policy)
    arrivals = {i: [i] for i in range(len(reqs))}  # one a step: batches in flight meanwhile
    assert tokens(run_checked(s, arrivals, {}, reqs)) == ref
    st = s.stats()
    assert st["retractions"] > 0 and st["host_loaded_tokens"] > 0
    assert s.engine.graph_runner is not None, "CUDA graphs should have run the decode steps"


def test_fp8_kv_through_the_tier_keeps_the_fp8_tokens(tiny_ckpts) -> None:
    """FP8 pages go through the tier under retraction and eviction: loads happen, every request
    ends with all its tokens, the books balance after every step (`run_checked`). (The bytes a
    load brings back are the FP8 bytes written: `test_backup_then_load_brings_back_the_same_bytes`.
    The tokens are not compared with a run without the tier: that run recomputes the prefixes in
    other batches, whose bf16 rounding the FP8 cache can turn into another greedy token.)"""
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 KV needs compute capability 8.9")
    reqs = workload()
    out, loaded = {}, {}
    for tier in (False, True):
        eng = EngineConfig(model=str(tiny_ckpts["llama"]), dtype="bfloat16", device="cuda",
                           page_size=4, max_kv_tokens=POOL, kv_cache_dtype="fp8_e4m3",
                           attn="triton")
        s = Scheduler(eng, SchedulerConfig(max_running_requests=16, schedule_conservativeness=0.05,
                                           enable_hierarchical_cache=tier))
        out[tier] = tokens(run_checked(s, {i: [i] for i in range(len(reqs))}, {}, reqs))
        loaded[tier] = s.stats()["host_loaded_tokens"]
    assert loaded[True] > 0 == loaded[False]
    assert {u: len(t) for u, t in out[True].items()} == {u: sp.max_tokens for u, (_, sp) in enumerate(reqs)}


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tp2_ranks_agree_with_the_tier(tiny_ckpts) -> None:
    """Each rank keeps its shard in its own host tier and decides alike: the tokens are those of
    the same TP group with a pool that holds everything."""
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.tp import scheduler_group

    reqs = workload()
    out = {}
    for kv, kw in ((None, {"kv_admission": "reserve"}),
                   (POOL, {"schedule_conservativeness": 0.05, "enable_hierarchical_cache": True})):
        eng = EngineConfig(model=str(tiny_ckpts["qwen3"]), dtype="float32", device="cuda",
                           page_size=16, max_kv_tokens=kv, tp=2)
        with scheduler_group(eng, SchedulerConfig(max_running_requests=16, **kw)) as s:
            out[kv] = tokens(run_checked(s, {0: list(range(len(reqs)))}, {}, reqs))
            if kv is not None:
                assert s.stats()["retractions"] > 0 and s.stats()["host_loaded_tokens"] > 0
    assert out[POOL] == out[None]


@pytest.mark.parametrize("tier", [False, True])
def test_the_multi_turn_bench_at_scale_completes_every_turn(tiny_ckpts, tier) -> None:
    """The multi-turn workload of `bench offline --multi-turn` at its GPU row's shape (100
    conversations x 6 turns, a pool of a quarter of the working set, bf16, the default attention
    backend, prefill chunks of 8192 with their graphs) on the tiny model: every turn is answered
    in full, the books balance at the end, and the tier loads its hits back."""
    from radixserve.bench.multi_turn import conversations, run_turns, working_set
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    # (questions and answers shorter than the row's: the tiny model's context is 1,024 tokens)
    convs = conversations(100, 6, 256, (16, 48), (16, 48), vocab_size=250, seed=0)
    eng = EngineConfig(model=str(tiny_ckpts["qwen3"]), dtype="bfloat16", device="cuda",
                       max_kv_tokens=working_set(convs) // 4)
    s = Scheduler(eng, SchedulerConfig(max_prefill_length=8192, enable_hierarchical_cache=tier,
                                       hicache_ratio=4.0))
    run = run_turns(s, convs)
    s.check_integrity()
    assert run.output_tokens == sum(sum(c.answers) for c in convs)
    assert len(run.ttft) == 100 * 6
    assert (run.host_hit_tokens > 0) == tier
    assert run.prefill_tokens <= run.prompt_tokens
