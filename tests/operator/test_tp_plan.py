"""TP sizing: weight estimates against published sizes, and TP choices worked out by hand.

Rule (tp_plan.py): per GPU, weights/TP + KV(16384 tokens) <= memoryRatio x memoryGiB, TP divides the
attention heads and divides (or is a multiple of) the KV heads."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from radixserve_operator.modelconfig import (
    EMBEDDED_DEFAULT,
    ModelConfigNotFound,
    ModelConfigUnavailable,
    fetch_config,
    parse_param_count,
    resolve_shape,
    shape_from_config,
    shape_from_hints,
)
from radixserve_operator.spec import SpecError, parse_spec
from radixserve_operator.tp_plan import SizingError, resolve_tp

# Published totals (model cards): the estimate counts every weight, embeddings and experts included.
PUBLISHED = {
    "Qwen/Qwen3-0.6B": 0.6e9,
    "Qwen/Qwen3-14B": 14.8e9,
    "Qwen/Qwen3-32B": 32.8e9,
    "meta-llama/Llama-3.1-70B-Instruct": 70.6e9,
    "Qwen/Qwen3-30B-A3B": 30.5e9,
    "Qwen/Qwen3-235B-A22B": 235e9,
}


@pytest.mark.parametrize("repo", sorted(PUBLISHED))
def test_parameter_count_matches_model_card(repo: str, model_configs: dict) -> None:
    shape = shape_from_config(model_configs[repo])
    assert shape.param_count == pytest.approx(PUBLISHED[repo], rel=0.01)


def test_moe_config_counts_all_experts(model_configs: dict) -> None:
    shape = shape_from_config(model_configs["Qwen/Qwen3-30B-A3B"])
    assert shape.num_experts == 128
    # Without its experts the model would be ~1.3B: the estimate must hold the whole 30.5B.
    assert shape.param_count > 30e9


def test_embedded_default_shape_matches_smollm2() -> None:
    # SmolLM2-135M: 30 layers, 9 heads, 3 KV heads, head_dim 64, 134.5M weights (tied embeddings).
    cfg = {
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    assert shape_from_config(cfg) == EMBEDDED_DEFAULT


# (model, memoryGiB, memoryRatio, expected TP) — the arithmetic, in GiB per GPU:
#   0.6B: 1.1 weights                                    -> 1
#   14B: 27.5 + 2.5 KV = 30.0 <= 72                      -> 1
#   32B: 61.0 + 4.0 KV = 65.0 <= 72 (ratio .9 of 80)     -> 1;  > 64 (ratio .8) -> 2 (30.5 + 2.0)
#   32B on 48 GiB: 65.0 > 43.2; TP2 32.5                 -> 2
#   70B: TP1 131.4 > 72 and > 126.9; TP2 65.7 + 2.5      -> 2 on 80 and on 141
#   70B on 40 GiB: TP2 68.2 > 36; TP4 32.9 + 1.25        -> 4
#   30B-A3B (MoE): 56.8 + 1.5 = 58.3 <= 72               -> 1;  on 24 GiB: TP2 29.2 > 21.6, TP4 14.6 -> 4
#   235B-A22B (MoE): TP4 109.5 + 0.7 <= 126.9 (141)      -> 4;  on 80: TP4 > 72, TP8 54.7 + 0.7 -> 8
AUTO_CASES = [
    ("Qwen/Qwen3-0.6B", 80, 0.9, 1),
    ("Qwen/Qwen3-0.6B", 141, 0.9, 1),
    ("Qwen/Qwen3-14B", 80, 0.9, 1),
    ("Qwen/Qwen3-32B", 80, 0.9, 1),
    ("Qwen/Qwen3-32B", 80, 0.8, 2),
    ("Qwen/Qwen3-32B", 48, 0.9, 2),
    ("meta-llama/Llama-3.1-70B-Instruct", 80, 0.9, 2),
    ("meta-llama/Llama-3.1-70B-Instruct", 141, 0.9, 2),
    ("meta-llama/Llama-3.1-70B-Instruct", 40, 0.9, 4),
    ("Qwen/Qwen3-30B-A3B", 80, 0.9, 1),
    ("Qwen/Qwen3-30B-A3B", 24, 0.9, 4),
    ("Qwen/Qwen3-235B-A22B", 141, 0.9, 4),
    ("Qwen/Qwen3-235B-A22B", 80, 0.9, 8),
]


def _spec(make_body, source: str, tensor: int | str, gib: float | None = None, ratio: float = 0.9):
    gpu = {"memoryGiB": gib} if gib is not None else {}
    return parse_spec(
        make_body(
            {
                "model": {"source": source},
                "parallelism": {"tensor": tensor},
                "gpu": gpu,
                "runtime": {"memoryRatio": ratio},
            }
        )
    )


@pytest.mark.parametrize("repo,gib,ratio,expected", AUTO_CASES)
def test_auto_tp(repo: str, gib: int, ratio: float, expected: int, make_body, fetch) -> None:
    spec = _spec(make_body, repo, "auto", gib, ratio)
    assert resolve_tp(spec, resolve_shape(spec.model, fetch)) == expected


def test_auto_tp_too_big_for_eight_gpus(make_body, fetch) -> None:
    spec = _spec(make_body, "Qwen/Qwen3-235B-A22B", "auto", 24)
    with pytest.raises(SizingError, match=r"no TP size in \[1, 2, 4, 8\] fits"):
        resolve_tp(spec, resolve_shape(spec.model, fetch))


def test_explicit_tp_that_does_not_fit_is_rejected_with_numbers(make_body, fetch) -> None:
    spec = _spec(make_body, "meta-llama/Llama-3.1-70B-Instruct", 1, 80)
    with pytest.raises(SizingError, match=r"spec.parallelism.tensor: TP 1: 131.4 GiB of weights"):
        resolve_tp(spec, resolve_shape(spec.model, fetch))


def test_explicit_tp_must_divide_attention_heads(make_body) -> None:
    spec = _spec(make_body, "default", 2)  # SmolLM2: 9 heads
    with pytest.raises(SizingError, match="does not divide the model's 9 attention heads"):
        resolve_tp(spec, EMBEDDED_DEFAULT)
    assert resolve_tp(_spec(make_body, "default", "auto", 24), EMBEDDED_DEFAULT) == 1


def test_tp_beyond_kv_heads_must_be_a_multiple_of_them(make_body) -> None:
    hints = {
        "parameterCount": "1B",
        "numAttentionHeads": 24,
        "numKeyValueHeads": 6,
        "numHiddenLayers": 16,
        "headDim": 64,
    }
    ok = _spec(make_body, "org/m", 2, 80)
    bad = parse_spec(
        make_body({"model": {"source": "org/m", "parameters": hints}, "parallelism": {"tensor": 4}})
    )
    assert resolve_tp(ok, shape_from_hints(hints)) == 2  # 2 divides 6
    with pytest.raises(
        SizingError, match="neither divides the model's 6 KV heads nor is a multiple"
    ):
        resolve_tp(bad, shape_from_hints(hints))  # 24 % 4 == 0 but 6 % 4 and 4 % 6 are not
    wide = {**hints, "numAttentionHeads": 32, "numKeyValueHeads": 4}
    wide_spec = parse_spec(
        make_body({"model": {"source": "org/m", "parameters": wide}, "parallelism": {"tensor": 8}})
    )
    assert resolve_tp(wide_spec, shape_from_hints(wide)) == 8  # KV heads replicated twice


def test_tp_is_capped_at_one_node(make_body) -> None:
    """One replica is one pod, and no node holds more than 8 GPUs: TP 16 is a spec error."""
    with pytest.raises(SpecError, match=r"one of 1, 2, 4, 8, auto, got 16"):
        parse_spec(make_body({"model": {"source": "org/m"}, "parallelism": {"tensor": 16}}))


def test_path_source_needs_hints_for_auto(make_body) -> None:
    spec = _spec(make_body, "pvc://models/llama", "auto", 80)
    assert resolve_shape(spec.model) is None
    with pytest.raises(SizingError, match="set spec.model.parameters"):
        resolve_tp(spec, None)
    assert resolve_tp(_spec(make_body, "/data/llama", 4, 80), None) == 4  # explicit: trusted


def test_hints_replace_the_hub(make_body) -> None:
    hints = {
        "parameterCount": "70.6B",
        "numAttentionHeads": 64,
        "numKeyValueHeads": 8,
        "numHiddenLayers": 80,
        "headDim": 128,
    }
    spec = parse_spec(
        make_body(
            {
                "model": {"source": "meta-llama/Llama-3.1-70B-Instruct", "parameters": hints},
                "parallelism": {"tensor": "auto"},
                "gpu": {"memoryGiB": 80},
            }
        )
    )

    def no_hub(*_a):
        raise AssertionError("hints must avoid the hub")

    assert resolve_tp(spec, resolve_shape(spec.model, no_hub)) == 2


@pytest.mark.parametrize(
    "text,value", [("14.8B", 14_800_000_000), ("600M", 600_000_000), (7000, 7000), ("1T", 10**12)]
)
def test_parse_param_count(text, value) -> None:
    assert parse_param_count(text) == value


def test_float32_doubles_the_weights(make_body, fetch) -> None:
    spec = _spec(make_body, "Qwen/Qwen3-32B", "auto", 80)
    f32 = parse_spec(
        make_body(
            {
                "model": {"source": "Qwen/Qwen3-32B"},
                "parallelism": {"tensor": "auto"},
                "gpu": {"memoryGiB": 80},
                "runtime": {"dtype": "float32"},
            }
        )
    )
    shape = resolve_shape(spec.model, fetch)
    assert resolve_tp(spec, shape) == 1
    assert resolve_tp(f32, shape) == 2  # 122.0 + 8.0 KV > 72; TP2 61.0 + 4.0 KV


def test_cpu_replica_is_always_tp1(make_body, fetch) -> None:
    spec = parse_spec(make_body({"gpu": {"enabled": False}, "parallelism": {"tensor": "auto"}}))
    assert resolve_tp(spec, EMBEDDED_DEFAULT) == 1


def test_unreachable_hub_is_a_clear_transient_error(monkeypatch) -> None:
    import huggingface_hub.utils._http as hf_http

    monkeypatch.setattr(hf_http.time, "sleep", lambda _s: None)  # skip the client's backoff waits
    with pytest.raises(
        ModelConfigUnavailable, match="cannot reach the Hugging Face hub for 'Qwen/Qwen3-0.6B'"
    ):
        fetch_config("Qwen/Qwen3-0.6B", None, "http://127.0.0.1:9")


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """Answers like the hub: config.json of org/present; 404 RepoNotFound for anything else."""

    BODY = json.dumps(
        {
            "hidden_size": 1024,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "vocab_size": 151936,
            "tie_word_embeddings": True,
        }
    ).encode()

    def _answer(self, with_body: bool) -> None:
        if not self.path.startswith("/org/present/resolve/"):
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("ETag", '"cafe"')
        self.send_header("X-Repo-Commit", "a" * 40)
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        if with_body:
            self.wfile.write(self.BODY)

    def do_HEAD(self) -> None:
        self._answer(False)

    def do_GET(self) -> None:
        self._answer(True)

    def log_message(self, *_a) -> None:
        pass


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_fetch_reads_config_json_from_the_hub(fake_hub) -> None:
    shape = shape_from_config(fetch_config("org/present", None, fake_hub))
    assert (shape.num_attention_heads, shape.num_kv_heads, shape.num_layers) == (16, 8, 28)


def test_missing_repo_is_a_permanent_error(fake_hub) -> None:
    with pytest.raises(ModelConfigNotFound, match="no config.json for 'org/absent'"):
        fetch_config("org/absent", None, fake_hub)


def test_an_unreachable_hub_is_not_asked_again_at_once(monkeypatch) -> None:
    """Each attempt costs the hub client's retries (~25 s): an air-gapped cluster must not pay
    them on every reconcile of a model with an explicit TP."""
    from radixserve_operator import modelconfig

    calls = []

    def unreachable(repo: str, revision: str | None, endpoint: str | None) -> dict:
        calls.append(repo)
        raise ModelConfigUnavailable(f"cannot reach the hub for {repo!r}")

    monkeypatch.setattr(modelconfig, "_fetch_config", unreachable)
    monkeypatch.setattr(modelconfig, "_unreachable", {})
    for _ in range(3):
        with pytest.raises(ModelConfigUnavailable, match="org/offline"):
            fetch_config("org/offline")
    assert calls == ["org/offline"]
    monkeypatch.setattr(modelconfig, "UNREACHABLE_TTL_S", 0.0)  # once believed long enough
    with pytest.raises(ModelConfigUnavailable):
        fetch_config("org/offline")
    assert len(calls) == 2


def test_fp8_kv_cache_halves_the_kv_share_of_sizing(make_body, fetch) -> None:
    """Qwen3-32B on 80 GiB at memoryRatio 0.8 (64 GiB): 61.0 GiB of bf16 weights + 4.0 GiB of
    bf16 KV (16,384 tokens) does not fit one GPU; with an FP8 cache the KV is 2.0 GiB and it does."""
    def spec(kv: str | None):
        rt = {"memoryRatio": 0.8} | ({"kvCacheDtype": kv} if kv else {})
        return parse_spec(make_body({"model": {"source": "Qwen/Qwen3-32B"},
                                     "parallelism": {"tensor": "auto"},
                                     "gpu": {"memoryGiB": 80}, "runtime": rt}))
    shape = resolve_shape(spec(None).model, fetch)
    assert resolve_tp(spec(None), shape) == 2
    assert resolve_tp(spec("bfloat16"), shape) == 2
    assert resolve_tp(spec("fp8_e4m3"), shape) == 1
    with pytest.raises(SizingError, match=r"61.0 GiB of weights plus 4.0 GiB of KV cache"):
        resolve_tp(parse_spec(make_body({"model": {"source": "Qwen/Qwen3-32B"},
                                         "parallelism": {"tensor": 1}, "gpu": {"memoryGiB": 80},
                                         "runtime": {"memoryRatio": 0.8}})), shape)


LLAMA_8B = {  # Llama-3.1-8B's config.json (the fields sizing reads)
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
CT_FP8 = {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}}}}
BLOCK_FP8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}


def test_fp8_weights_count_one_byte_and_ask_for_fewer_gpus(make_body) -> None:
    """Llama-3.1-8B: 8.03B weights, of which 6.98B in the layers' linear projections (by hand:
    32 x (4096 x 128 x 80 + 3 x 4096 x 14336)) and 1.05B in the two embeddings. bf16: 16.06 GB
    (14.96 GiB); per-channel FP8: 6.98 + 2 x 1.05 = 9.08 GB (8.46 GiB). On 16 GiB GPUs at
    memoryRatio 0.9 (14.4 GiB) with 2 GiB of KV (16,384 tokens), bf16 needs TP 2, FP8 fits one.
    Block-scaled FP8 stays FP8 on the GPU too, with a float32 scale per row and 128 columns:
    6.98 x (1 + 4/128) + 2 x 1.05 = 9.30 GB."""
    bf16 = shape_from_config(LLAMA_8B)
    fp8 = shape_from_config({**LLAMA_8B, "quantization_config": CT_FP8})
    block = shape_from_config({**LLAMA_8B, "quantization_config": BLOCK_FP8})
    assert bf16.param_count == fp8.param_count == pytest.approx(8.03e9, rel=0.002)
    assert bf16.weight_bytes() == pytest.approx(16.06e9, rel=0.002)
    assert fp8.weight_bytes() == pytest.approx(9.08e9, rel=0.002)
    assert block.weight_bytes() == pytest.approx(9.30e9, rel=0.002)
    assert fp8.weight_bytes("float32") == pytest.approx(6.98e9 + 4 * 1.05e9, rel=0.002)

    def fake(repo: str, revision: str | None = None) -> dict:
        return {"org/llama-8b": LLAMA_8B, "org/llama-8b-fp8": {**LLAMA_8B, "quantization_config": CT_FP8},
                "org/llama-8b-block-fp8": {**LLAMA_8B, "quantization_config": BLOCK_FP8}}[repo]

    tps = {}
    for repo in ("org/llama-8b", "org/llama-8b-fp8", "org/llama-8b-block-fp8"):
        spec = _spec(make_body, repo, "auto", 16, 0.9)
        tps[repo] = resolve_tp(spec, resolve_shape(spec.model, fake))
    assert tps == {"org/llama-8b": 2, "org/llama-8b-fp8": 1, "org/llama-8b-block-fp8": 1}
