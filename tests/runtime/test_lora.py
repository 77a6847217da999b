"""LoRA adapters (`lora/`, `layers/lora.py`): a batch mixing requests of several PEFT adapters and
of the base model gives, for each request, transformers + PEFT's greedy tokens with its adapter,
unmerged and merged into the weights; whatever the number of device slots; with the prefix
cache kept apart per adapter; with adapters loaded and unloaded at run time, bad ones refused
before anything is loaded."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixserve import LLM, SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.scheduler.scheduler import Scheduler
from radixserve.testing import write_tiny_checkpoint
from tests.peft_adapters import (
    ADAPTERS,
    peft_greedy,
    peft_greedy_both,
    write_adapters,
    write_peft_adapter,
)
from tests.runtime.helpers import drain, fast_corners, random_prompts

MAX_NEW = 10
PROMPTS = random_prompts(4, [5, 23, 40, 71], 300, seed=21)
NAMES = [None, *ADAPTERS]  # None: the base model


class _Cases(dict):
    """Per architecture, made when first asked for: the base checkpoint, its adapters, and
    PEFT's tokens for every prompt under each (the base model's too), unmerged and merged."""

    def __init__(self, ckpts: dict, tmp) -> None:
        super().__init__()
        self.ckpts, self.tmp = ckpts, tmp

    def __missing__(self, arch: str) -> dict:
        base = self.ckpts[arch]
        adapters = write_adapters(base, self.tmp.mktemp(f"lora-{arch}"))
        want, merged = {None: peft_greedy(base, None, PROMPTS, MAX_NEW)}, {}
        for name, path in adapters.items():
            want[name], merged[name] = peft_greedy_both(base, path, PROMPTS, MAX_NEW)
        self[arch] = {"base": base, "adapters": adapters, "want": want, "merged": merged}
        return self[arch]


@pytest.fixture(scope="module")
def lora_case(tiny_ckpts, tmp_path_factory) -> dict:
    return _Cases(tiny_ckpts, tmp_path_factory)


def _paths(case: dict) -> list[str]:
    return [f"{n}={p}" for n, p in case["adapters"].items()]


def _scheduler(case: dict, **kw) -> Scheduler:
    sched = {k: kw.pop(k) for k in ("max_prefill_length", "cache") if k in kw}
    eng = EngineConfig(model=str(case["base"]), dtype="float32", device="cpu",
                       lora_paths=_paths(case), **kw)
    return Scheduler(eng, SchedulerConfig(max_running_requests=16, **sched))


def _run_mixed(s: Scheduler, names: list[str | None], *, first_uid: int = 0,
               mixed: bool = True) -> dict[tuple[str | None, int], list[int]]:
    """Every prompt under every name in `names`, all queued before the first step (so batches
    mix them, checked with `mixed`), interleaved; each one's tokens."""
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    keys = [(name, i) for i in range(len(PROMPTS)) for name in names]
    for uid, (name, i) in enumerate(keys, first_uid):
        s.add_request(uid, PROMPTS[i], sp, lora=name)
    seen_together = set()
    out: dict[int, list] = {}
    while s.has_work:
        seen_together = max(seen_together, {r.lora.name if r.lora else None for r in s.running},
                            key=len)
        for o in s.step():
            out.setdefault(o.uid, []).append(o.token_id)
    s.check_integrity()
    assert not mixed or len(seen_together) >= 3, "the batches never mixed adapters"
    return {k: out[uid] for uid, k in enumerate(keys, first_uid)}


@pytest.mark.parametrize("arch,page_size,max_prefill", fast_corners(
    [("qwen3", 4, 32), ("llama3", 1, 512), ("qwen3", 1, 512), ("llama3", 16, 16)],
    {("qwen3", 4, 32), ("qwen3", 1, 512)}))
def test_mixed_batch_equals_peft_per_adapter(lora_case, arch, page_size, max_prefill) -> None:
    case = lora_case[arch]
    for name in ADAPTERS:  # each adapter changes the model's tokens: the comparison means something
        assert case["want"][name] != case["want"][None], name
    s = _scheduler(case, page_size=page_size, max_prefill_length=max_prefill)
    got = _run_mixed(s, NAMES)
    for (name, i), tokens in got.items():
        assert tokens == case["want"][name][i], f"{name or 'base'}, prompt {i}: differs from PEFT"
        if name is not None:
            assert tokens == case["merged"][name][i], f"{name}, prompt {i}: differs from merged"


def test_fewer_slots_than_adapters_waits_and_refills(lora_case) -> None:
    """One device slot for three adapters: their requests take turns (least recently used slot
    refilled from host memory), each still gets PEFT's tokens."""
    case = lora_case["qwen3"]
    s = _scheduler(case, max_loras_per_batch=1, page_size=4)
    got = _run_mixed(s, NAMES[:2], mixed=False) | _run_mixed(s, NAMES, first_uid=100, mixed=False)
    for (name, i), tokens in got.items():
        assert tokens == case["want"][name][i], f"{name or 'base'}, prompt {i}"


def test_prefix_cache_is_never_shared_across_adapters(lora_case) -> None:
    case = lora_case["qwen3"]
    s = _scheduler(case, page_size=4)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    prompt = PROMPTS[3]
    hits = []
    for uid, name in enumerate([None, "sql", "chat", "sql", None]):
        s.add_request(uid, prompt, sp, lora=name)
        tokens = [o.token_id for o in drain(s)[uid]]
        assert tokens == case["want"][name][3], name
        hits.append(s.stats()["prefix_hit_tokens"])
    assert hits[0] == hits[1] == hits[2], "a request reused another adapter's (or the base's) KV"
    assert hits[3] - hits[2] >= 64 and hits[4] - hits[3] >= 64, "the same adapter's KV not reused"


def test_pieces_of_prefill_graphs_apply_the_adapters(lora_case) -> None:
    """The prefill-graph pieces (run eagerly over their padded static buffers on CPU) read the
    batch's adapter groups from their own buffers: the plain forward's hidden states."""
    from radixserve.engine.engine import Engine
    from radixserve.engine.prefill_graph import PrefillGraphRunner
    from radixserve.lora.adapter import read_adapter
    from tests.runtime.test_prefill_graph import _batch

    case = lora_case["qwen3"]
    engine = Engine(EngineConfig(model=str(case["base"]), dtype="float32", device="cpu",
                                 lora_paths=_paths(case)), max_running_requests=8)
    pool = engine.lora_pool
    runner = PrefillGraphRunner(engine.model.model, engine.attn_backend, 256,
                                engine.kv_pool.dummy_slot, use_graphs=False, lora=pool)
    rows = [engine.table.alloc_row() for _ in PROMPTS[:3]]
    for slot, (row, name) in enumerate(zip(rows, ["sql", None, "chat"])):
        if name is not None:
            pool.fill(slot, read_adapter(name, case["adapters"][name], engine.model,
                                         pool.max_rank, torch.float32))
        pool.row_slots[row] = slot if name is not None else -1
    hidden = {}
    for uses_lora, piecewise in ((True, True), (True, False), (False, False)):
        batch = _batch(engine, PROMPTS[:3], [0, 0, 0], rows)
        batch.uses_lora = uses_lora
        with torch.inference_mode():
            hidden[uses_lora, piecewise] = (runner.run(batch) if piecewise
                                            else engine.forward_hidden(batch)).clone()
    torch.testing.assert_close(hidden[True, True], hidden[True, False], rtol=1e-5, atol=1e-5)
    base_rows = slice(len(PROMPTS[0]), len(PROMPTS[0]) + len(PROMPTS[1]))
    torch.testing.assert_close(hidden[True, True][base_rows], hidden[False, False][base_rows])
    assert not torch.allclose(hidden[True, True][:len(PROMPTS[0])],
                              hidden[False, False][:len(PROMPTS[0])])


def _bad_adapters(case: dict, root: Path) -> dict[str, tuple[Path, str]]:
    """Adapters the server must refuse, each with a word of the reason it must give."""
    base = case["base"]
    bad = {"rank": (case["adapters"]["mlp"], "above the server's --max-lora-rank 8")}
    bad["dora"] = (write_peft_adapter(base, root / "dora", 5, r=4, target_modules=["q_proj"],
                                      use_dora=True), "use_dora")
    wide = write_tiny_checkpoint("qwen3", root / "wide", hidden_size=96)
    bad["other model"] = (write_peft_adapter(wide, root / "other", 6, r=4,
                                             target_modules=["q_proj"]), "another model")
    bad["lm head"] = (write_peft_adapter(base, root / "head", 7, r=4,
                                         target_modules=["lm_head"]), "base weights are not")
    renamed = root / "renamed"  # a module the model does not have, as a plain A and B
    shutil.copytree(case["adapters"]["sql"], renamed)
    tensors = load_file(renamed / "adapter_model.safetensors")
    old = "base_model.model.model.layers.0.self_attn.q_proj"
    for m in "AB":
        tensors[f"base_model.model.model.layers.0.self_attn.x_proj.lora_{m}.weight"] = tensors.pop(
            f"{old}.lora_{m}.weight")
    save_file(tensors, renamed / "adapter_model.safetensors")
    bad["unknown module"] = (renamed, "x_proj: the model has no such linear projection")
    missing = root / "missing-weights"
    shutil.copytree(case["adapters"]["sql"], missing)
    (missing / "adapter_model.safetensors").unlink()
    bad["no weights"] = (missing, "no adapter_model.safetensors")
    not_lora = root / "prefix-tuning"
    shutil.copytree(case["adapters"]["sql"], not_lora)
    cfg = json.loads((not_lora / "adapter_config.json").read_text())
    (not_lora / "adapter_config.json").write_text(json.dumps(cfg | {"peft_type": "PREFIX_TUNING"}))
    bad["not lora"] = (not_lora, "only LORA")
    bad_pattern = root / "bad-pattern"
    shutil.copytree(case["adapters"]["sql"], bad_pattern)
    (bad_pattern / "adapter_config.json").write_text(json.dumps(cfg | {"rank_pattern": {"(": 4}}))
    bad["bad pattern"] = (bad_pattern, "is not a regular expression")
    bad["no dir"] = (root / "nowhere", "no such adapter directory")
    return bad


def test_load_and_unload_at_run_time(lora_case, tmp_path) -> None:
    case = lora_case["qwen3"]
    llm = LLM(str(case["base"]), dtype="float32", device="cpu", enable_lora=True,
              max_lora_rank=8, page_size=4)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)

    def tokens(name: str | None) -> list[list[int]]:
        return [r.token_ids for r in llm.generate(PROMPTS, sp, lora=name)]

    assert tokens(None) == case["want"][None]
    with pytest.raises(ValueError, match="'sql' is not loaded; served: none"):
        tokens("sql")
    for what, (path, reason) in _bad_adapters(case, tmp_path).items():
        with pytest.raises(ValueError, match=reason):
            llm.load_lora("bad", str(path))
        assert llm.scheduler.served_loras() == {}, f"{what}: something was loaded"
    assert tokens(None) == case["want"][None]  # unharmed
    llm.load_lora("sql", str(case["adapters"]["sql"]))
    with pytest.raises(ValueError, match="already loaded"):
        llm.load_lora("sql", str(case["adapters"]["chat"]))
    assert tokens("sql") == case["want"]["sql"]
    llm.unload_lora("sql")
    with pytest.raises(ValueError, match="not loaded"):
        llm.unload_lora("sql")
    # the same name, other weights: nothing of the old adapter (its cached KV) is reused
    llm.load_lora("sql", str(case["adapters"]["chat"]))
    assert tokens("sql") == case["want"]["chat"]
    llm.scheduler.check_integrity()


def test_unloading_lets_accepted_requests_finish(lora_case) -> None:
    case = lora_case["qwen3"]
    s = _scheduler(case, page_size=4, max_loras_per_batch=1)
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    s.add_request(0, PROMPTS[1], sp, lora="chat")
    s.add_request(1, PROMPTS[2], sp, lora="sql")  # waits: the one slot holds chat
    s.step()
    s.unload_lora("sql")
    s.unload_lora("chat")
    with pytest.raises(ValueError, match="not loaded"):
        s.add_request(2, PROMPTS[0], sp, lora="sql")
    out = drain(s)
    assert [o.token_id for o in out[0]] == case["want"]["chat"][1]
    assert [o.token_id for o in out[1]] == case["want"]["sql"][2]
    assert s.lora.served.keys() == {"mlp"} and not s.lora._slots


# TP=2 over gloo, a second process for seconds: test_tp.py's TP=2 cases stay in the fast loop
@pytest.mark.slow  # (left out of `make test-fast`; `make test` runs it)
def test_tp2_mixed_batch_equals_peft(lora_case) -> None:
    case = lora_case["qwen3"]
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    llm = LLM(str(case["base"]), dtype="float32", device="cpu", tp=2, page_size=4,
              max_prefill_length=32, lora_paths=_paths(case)[:2], enable_lora=True)

    async def all_at_once() -> list[list[list[int]]]:
        calls = [llm.agenerate(PROMPTS, sp, lora=name) for name in NAMES[:3]]
        return [[r.token_ids for r in res] for res in await asyncio.gather(*calls)]

    try:
        got = asyncio.run(all_at_once())
        for name, tokens in zip(NAMES[:3], got):
            assert tokens == case["want"][name], name or "base"
        llm.load_lora("mlp", str(case["adapters"]["mlp"]))  # reaches the follower too
        assert [r.token_ids for r in llm.generate(PROMPTS, sp, lora="mlp")] == case["want"]["mlp"]
    finally:
        llm.close()
