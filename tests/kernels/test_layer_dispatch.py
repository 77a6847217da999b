"""The model layers' switch to the Triton kernels, run on CPU through Triton's interpreter: with
the switch forced on, every kernel is launched and the model's logits and greedy tokens are those
of the torch path. (On CUDA the switch is on by itself; the gpu tier checks it against
transformers.)"""
from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.kernels.kernel_cases import interpreter_only
from tests.models.helpers import our_logits

pytestmark = interpreter_only
PROMPT = [5, 17, 99, 3, 250, 42, 7, 7, 130, 64, 11, 200, 19, 88, 301, 6, 45]
DENSE = {"rms_norm", "fused_add_rms_norm", "qk_norm_rope_", "silu_and_mul"}
SPARSE = DENSE | {"topk_softmax", "fused_moe"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from radixserve.testing import write_tiny_checkpoint

    root = tmp_path_factory.mktemp("dispatch")
    return {a: write_tiny_checkpoint(a, root / a) for a in ("llama3", "qwen3", "qwen3_moe")}


@pytest.fixture
def kernels_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Force the Triton path for CPU tensors; count each kernel launcher's calls."""
    from radixserve.kvcache import pool
    from radixserve.layers import activation, moe, norm, rotary
    from radixserve.utils import kernel_path

    calls: collections.Counter = collections.Counter()

    def counted(name: str, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for module, names in [
        (norm, ["rms_norm", "fused_add_rms_norm"]), (activation, ["silu_and_mul"]),
        (rotary, ["qk_norm_rope_"]), (pool, ["store_kv"]), (moe, ["topk_softmax"]),
    ]:
        for name in names:
            monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    monkeypatch.setitem(moe.MOE_BACKENDS._items, "triton",
                        counted("fused_moe", moe.MOE_BACKENDS.get("triton")))
    monkeypatch.setattr(kernel_path, "use_triton", lambda t: True)
    yield calls


def test_cpu_tensors_take_the_torch_path_even_when_interpreting() -> None:
    import os

    from radixserve.utils import kernel_path

    assert os.environ.get("TRITON_INTERPRET") == "1"  # set process-wide by this folder's conftest
    assert not kernel_path.use_triton(torch.zeros(1))


@pytest.mark.parametrize("arch", ["llama3", "qwen3", "qwen3_moe"])
def test_model_logits_through_kernels_match_torch_path(ckpts, arch, request) -> None:
    from radixserve.models.loader import load_model

    model, _ = load_model(ckpts[arch], torch.float32, "cpu")
    want = our_logits(model, PROMPT)
    calls = request.getfixturevalue("kernels_on")
    got = our_logits(model, PROMPT)
    expected = SPARSE if arch == "qwen3_moe" else DENSE
    assert {n for n, c in calls.items() if c} == expected
    # one rotary per layer, which also does qwen3's per-head q/k norms; every other norm but
    # the first layer's input norm carries the residual add
    layers = model.hf_config.num_hidden_layers
    assert calls["qk_norm_rope_"] == layers
    assert calls["rms_norm"] == 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pool_store_kv_through_kernel_matches_torch_path(kernels_on) -> None:
    from radixserve.kvcache.pool import MHAKVPool

    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(5, 4, 8, generator=gen)  # k and v as strided views of one tensor
    k, v, loc = kv[:, :2], kv[:, 2:], torch.tensor([9, 0, 4, 15, 3])
    pools = [MHAKVPool(2, 4, 4, 2, 8, torch.float32, "cpu") for _ in range(2)]
    pools[0].store_kv(k, v, loc, layer_id=1)
    assert kernels_on["store_kv"] == 1
    pools[1].k_cache(1)[loc] = k
    pools[1].v_cache(1)[loc] = v
    assert torch.equal(pools[0]._kv, pools[1]._kv)
    assert pools[0].k_cache(0).abs().sum() == 0  # other layers untouched


def test_greedy_tokens_through_kernels_match_torch_path(ckpts, request) -> None:
    """The whole engine on CPU (torch attention backend, so KV goes through `pool.store_kv`),
    prefill in chunks then decode: the same tokens with the kernels as without."""
    from radixserve import LLM, SamplingParams

    sp = SamplingParams(max_tokens=3, ignore_eos=True)
    prompts = [PROMPT[:9], PROMPT[:4]]

    def run() -> list[list[int]]:
        llm = LLM(str(ckpts["qwen3_moe"]), dtype="float32", device="cpu", page_size=4,
                  max_prefill_length=8, max_running_requests=4)
        return [r.token_ids for r in llm.generate(prompts, sp)]

    want = run()
    calls = request.getfixturevalue("kernels_on")
    assert run() == want
    assert calls["store_kv"] > 0 and calls["fused_moe"] > 0


def test_linear_streams_few_16bit_rows_through_the_skinny_kernel(monkeypatch) -> None:
    """Decode-sized 16-bit batches take the skinny kernel (same result as F.linear); larger
    batches and float32 (the parity reference) stay on F.linear."""
    from radixserve.layers import linear as lin
    from radixserve.utils import kernel_path

    rows_seen: list[int] = []
    skinny = lin.skinny_gemm

    def counted(x, w, b):
        rows_seen.append(x.shape[0])
        return skinny(x, w, b)

    monkeypatch.setattr(lin, "skinny_gemm", counted)
    monkeypatch.setattr(kernel_path, "use_triton", lambda t: True)
    gen = torch.Generator().manual_seed(3)
    w = (torch.randn(24, 40, generator=gen) / 6).half()
    b = torch.randn(24, generator=gen).half()
    for m, dtype in [(1, torch.float16), (16, torch.float16), (17, torch.float16), (3, torch.float32)]:
        x = torch.randn(m, 40, generator=gen).to(dtype)
        got = lin.linear(x, w.to(dtype), b.to(dtype))
        want = torch.nn.functional.linear(x.float(), w.float(), b.float())
        torch.testing.assert_close(got.float(), want, rtol=2e-3, atol=2e-3)
    assert rows_seen == [1, 16]
