"""EAGLE-3 drafting: a head in the published format (written here from the format's definition,
with a draft vocabulary smaller than the target's and its d2t map) drafts what a pure-torch
reading of that definition drafts from transformers' hidden states of the target; greedy output
with it equals plain decoding token for token; a malformed checkpoint is refused by name before
the target loads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixserve import SamplingParams
from radixserve.config import EngineConfig, SchedulerConfig
from radixserve.scheduler.scheduler import Scheduler
from radixserve.speculative import factory
from radixserve.testing import write_tiny_checkpoint
from tests.runtime.helpers import drain, random_prompts

MAX_NEW = 16
HEAD = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
# the targets: a 7-layer llama reads the default layers (the inputs of layers 2, 3 and 4); a
# 4-layer qwen3 names its own in eagle_config (the outputs of layers 0, 1 and 2)
TARGETS = {"llama": (7, None), "qwen3": (4, [0, 1, 2])}


def write_eagle3(path: Path, target: Path, *, seed: int = 0, draft_vocab: int = 200,
                 layer_ids: list[int] | None = None, drop: str | None = None,
                 reshape: str | None = None) -> Path:
    """A random EAGLE-3 head for `target` under the published names and config fields."""
    path.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
           "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
           "max_position_embeddings": 2048, "tie_word_embeddings": False, "hidden_act": "silu",
           "torch_dtype": "float32", **HEAD}
    if layer_ids is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids,
                               "use_aux_hidden_state": True}
    (path / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(seed)
    h, inter, q, kv = 64, 96, 4 * 16, 2 * 16

    def mat(*shape: int, gain: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * gain / shape[-1] ** 0.5

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    hot = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    m = "midlayer."
    w = {"fc.weight": mat(h, 3 * h, gain=0.3), m + "input_layernorm.weight": norm(h),
         m + "hidden_norm.weight": norm(h), m + "post_attention_layernorm.weight": norm(h),
         m + "self_attn.q_proj.weight": mat(q, 2 * h), m + "self_attn.k_proj.weight": mat(kv, 2 * h),
         m + "self_attn.v_proj.weight": mat(kv, 2 * h), m + "self_attn.o_proj.weight": mat(h, q, gain=4.0),
         m + "mlp.gate_proj.weight": mat(inter, h), m + "mlp.up_proj.weight": mat(inter, h),
         m + "mlp.down_proj.weight": mat(h, inter, gain=4.0), "norm.weight": norm(h),
         "lm_head.weight": mat(draft_vocab, h),
         "d2t": hot - torch.arange(draft_vocab), "t2d": t2d}
    if drop is not None:
        del w[drop]
    if reshape is not None:
        w[reshape] = w[reshape][..., :-1]
    from safetensors.torch import save_file

    save_file({k: t.contiguous() for k, t in w.items()}, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def eagle(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each target arch: (its checkpoint, an EAGLE-3 head for it)."""
    root = tmp_path_factory.mktemp("eagle3")
    out = {}
    for arch, (layers, ids) in TARGETS.items():
        target = write_tiny_checkpoint(arch, root / arch, seed=1, num_hidden_layers=layers)
        out[arch] = (target, write_eagle3(root / f"{arch}-head", target, layer_ids=ids))
    return out


def _scheduler(target: Path, head: Path | None = None, page_size: int = 1, overlap: bool = True,
               chunk: int | None = None) -> Scheduler:
    spec = ({"speculative_algorithm": "eagle3", "speculative_draft_model_path": str(head)}
            if head is not None else {})
    return Scheduler(EngineConfig(model=str(target), dtype="float32", device="cpu",
                                  page_size=page_size, max_kv_tokens=4096),
                     SchedulerConfig(overlap=overlap, max_prefill_length=chunk,
                                     max_running_requests=8, **spec))


def _tokens(s: Scheduler, prompts: list[list[int]], sp: SamplingParams) -> dict[int, list[int]]:
    for uid, p in enumerate(prompts):
        s.add_request(uid, p, sp)
    return {uid: [o.token_id for o in outs] for uid, outs in drain(s).items()}


def _prompts() -> list[list[int]]:
    return [[5, 6, 7, 8] * 5, list(range(20, 40))] + random_prompts(3, [3, 17, 33], 250, seed=7)


# --- a pure-torch reading of the format -----------------------------------------------------

def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + HEAD["rms_norm_eps"]) * w


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / HEAD["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    half = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return x * cos + half * sin


def _head_reference(w: dict[str, torch.Tensor], embeds: torch.Tensor,
                    hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The head over a whole sequence (causal): (final-norm output, the hidden before it)."""
    m, t = "midlayer.", embeds.shape[0]
    x = torch.cat([_rms(embeds, w[m + "input_layernorm.weight"]),
                   _rms(hidden, w[m + "hidden_norm.weight"])], -1)
    q = (x @ w[m + "self_attn.q_proj.weight"].T).view(t, 4, 16)
    k = (x @ w[m + "self_attn.k_proj.weight"].T).view(t, 2, 16)
    v = (x @ w[m + "self_attn.v_proj.weight"].T).view(t, 2, 16)
    pos = torch.arange(t)
    q, k = _rope(q, pos), _rope(k, pos)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / 4.0
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, 64)
    r = hidden + o @ w[m + "self_attn.o_proj.weight"].T
    a = _rms(r, w[m + "post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(a @ w[m + "mlp.gate_proj.weight"].T) * (a @ w[m + "mlp.up_proj.weight"].T)
    r = r + mlp @ w[m + "mlp.down_proj.weight"].T
    return _rms(r, w["norm.weight"]), r


@torch.inference_mode()
def _reference_drafts(target: Path, head: Path, ids: list[int], n: int,
                      layers: list[int]) -> tuple[list[int], torch.Tensor]:
    """Drafts for a request whose tokens are `ids` (the last one not yet run by the target):
    transformers' hidden states entering `layers`, then the chain the format defines. With
    them, what `lm_head` read for each [n, H]."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    w = load_file(str(head / "model.safetensors"))
    end = len(ids) - 1
    states = model(torch.tensor([ids[:end]]), output_hidden_states=True).hidden_states
    aux = torch.cat([states[i][0] for i in layers], -1)  # (states[i]: what enters layer i)
    embed = model.get_input_embeddings().weight
    toks, hidden = list(ids[1:end + 1]), aux @ w["fc.weight"].T
    drafts, rows = [], []
    for _ in range(n):
        normed, out = _head_reference(w, embed[torch.tensor(toks)], hidden)
        rows.append(normed[-1])
        d = int((normed[-1] @ w["lm_head.weight"].T).argmax())
        drafts.append(d + int(w["d2t"][d]))
        toks.append(drafts[-1])
        hidden = torch.cat([hidden, out[-1:]])
    return drafts, torch.stack(rows)


@pytest.mark.parametrize("arch", list(TARGETS))
def test_the_heads_drafts_are_the_formats(eagle, arch, monkeypatch) -> None:
    """At the first decode step and again after some verified steps (the head caught up on the
    kept drafts), the drafter proposes what the reference computes from transformers' states,
    from the same final-norm outputs."""
    target, head = eagle[arch]
    layers, ids = TARGETS[arch]
    aux = [2, layers // 2, layers - 3] if ids is None else [i + 1 for i in ids]
    s = _scheduler(target, head, overlap=False)
    lm_head, seen = s.spec.drafter.head.lm_head, []
    forward = lm_head.forward
    monkeypatch.setattr(lm_head, "forward", lambda x: seen.append(x.clone()) or forward(x))
    s.add_request(0, _prompts()[0], SamplingParams(max_tokens=MAX_NEW, ignore_eos=True))
    for steps in (1, 4):
        for _ in range(steps):
            s.step()
        req = s.reqs[0]
        seen.clear()
        got = s.spec.drafter.propose([req], [4])[0]
        want, rows = _reference_drafts(target, head, req.all_ids, 4, aux)
        assert got == want, req.all_ids
        torch.testing.assert_close(torch.cat(seen), rows, atol=1e-4, rtol=1e-4)
    drain(s)


@pytest.mark.parametrize("arch", list(TARGETS))
@pytest.mark.parametrize(("page_size", "overlap", "chunk"),
                         [(1, True, None), (4, False, None), (4, True, 16), (1, False, 16)])
def test_greedy_tokens_equal_plain_decoding(eagle, arch, page_size, overlap, chunk) -> None:
    target, head = eagle[arch]
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    plain = _tokens(_scheduler(target, page_size=page_size, overlap=overlap, chunk=chunk),
                    _prompts(), sp)
    s = _scheduler(target, head, page_size, overlap, chunk)
    assert _tokens(s, _prompts(), sp) == plain
    stats = s.stats()
    assert stats["spec_verify_steps"] > 0 and stats["spec_draft_tokens"] > 0, stats


def test_a_shared_prefix_reads_the_hidden_states_cached_with_it(eagle) -> None:
    """A second request on the same prompt finds its KV in the prefix cache: the head reads the
    hidden states stored at those slots, and drafts what it drafted for the first."""
    target, head = eagle["qwen3"]
    s = _scheduler(target, head, overlap=False)
    prompt, sp = _prompts()[1], SamplingParams(max_tokens=2, ignore_eos=True)
    firsts = []
    for uid in (0, 1):
        s.add_request(uid, prompt, sp)
        s.step()
        req = s.reqs[uid]
        firsts.append(s.spec.drafter.propose([req], [3])[0])
        drain(s)
    assert firsts[0] == firsts[1]


@pytest.mark.parametrize(("drop", "reshape", "name"), [
    ("midlayer.hidden_norm.weight", None, "midlayer.hidden_norm.weight"),
    ("d2t", None, "d2t"),
    (None, "fc.weight", "fc.weight"),
    (None, "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.q_proj.weight"),
])
def test_a_malformed_head_is_refused_by_name_before_the_target_loads(
        eagle, tmp_path, monkeypatch, drop, reshape, name) -> None:
    target, _ = eagle["qwen3"]
    head = write_eagle3(tmp_path / "head", target, layer_ids=[0, 1, 2], drop=drop, reshape=reshape)

    def no_load(*args, **kwargs):
        raise AssertionError("the target loaded before the head was checked")

    monkeypatch.setattr("radixserve.engine.engine.load_model", no_load)
    with pytest.raises(ValueError, match=rf"speculative_draft_model_path: .*{name}"):
        _scheduler(target, head)


def test_aux_layers_out_of_the_target_are_refused(eagle, tmp_path) -> None:
    target, _ = eagle["qwen3"]  # 4 layers: the default (2, 2, 1) repeats one
    head = write_eagle3(tmp_path / "head", target)
    with pytest.raises(ValueError, match="3 distinct target layers"):
        factory.plan(EngineConfig(model=str(target), dtype="float32", device="cpu"),
                     SchedulerConfig(speculative_algorithm="eagle3",
                                     speculative_draft_model_path=str(head)))


def test_flags_eagle3_needs_a_head_and_no_graphs_or_host_tier(eagle) -> None:
    with pytest.raises(ValueError, match="speculative_draft_model_path"):
        SchedulerConfig(speculative_algorithm="eagle3")
    with pytest.raises(ValueError, match="enable_hierarchical_cache"):
        SchedulerConfig(speculative_algorithm="eagle3", speculative_draft_model_path="x",
                        enable_hierarchical_cache=True)
    target, head = eagle["llama"]
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        factory.plan(EngineConfig(model=str(target), cuda_graph_max_bs=8),
                     SchedulerConfig(speculative_algorithm="eagle3",
                                     speculative_draft_model_path=str(head)))


def _rewrite(file: Path, **tensors: torch.Tensor) -> None:
    from safetensors.torch import load_file, save_file

    w = load_file(str(file))
    w.update(tensors)
    save_file(w, str(file))


def test_a_head_that_drafts_the_targets_token_keeps_every_draft(tmp_path) -> None:
    """The machinery's ceiling, on a degenerate pair (no trained head drafts a random target's
    tokens): a target whose final norm is zero scores every token 0, so its greedy token is
    always id 0; a head with a zero final norm drafts draft id 0, which d2t maps to target id 0.
    Every draft is then kept: the verify path, the head's catch-up on kept drafts and the d2t
    map, end to end."""
    target = write_tiny_checkpoint("qwen3", tmp_path / "target", seed=1, num_hidden_layers=4)
    _rewrite(target / "model.safetensors", **{"model.norm.weight": torch.zeros(64)})
    head = write_eagle3(tmp_path / "head", target, layer_ids=[0, 1, 2])
    from safetensors.torch import load_file

    hot = load_file(str(head / "model.safetensors"))["d2t"] + torch.arange(200)
    hot = torch.cat([torch.zeros(1, dtype=hot.dtype), hot[hot != 0][:199]]).sort().values
    _rewrite(head / "model.safetensors", **{"norm.weight": torch.zeros(64),
                                            "d2t": hot - torch.arange(200)})
    sp = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)
    s = _scheduler(target, head)
    got = _tokens(s, _prompts(), sp)
    assert got == _tokens(_scheduler(target), _prompts(), sp)
    assert all(t == 0 for toks in got.values() for t in toks)
    stats = s.stats()
    assert stats["spec_draft_tokens"] > 0
    assert stats["spec_accepted_tokens"] == stats["spec_draft_tokens"]
