"""`radixserve bench offline` end to end on CPU: every configuration it times produces exactly the
requested tokens (the bench asserts it), the TP=2 group starts and stops once per configuration,
and the report carries the lines a reader compares."""
from __future__ import annotations

import re

import pytest

from radixserve.cli import main

ARGS = ["bench", "offline", "--device", "cpu", "--dtype", "float32", "--num-prompts", "6",
        "--input-len", "4", "40", "--output-len", "3", "9", "--warmup", "2"]


def tok_s(out: str, label: str) -> float:
    m = re.search(rf"^{re.escape(label)}\s+([\d.]+) output tok/s", out, re.MULTILINE)
    assert m, f"no {label!r} line in:\n{out}"
    return float(m.group(1))


@pytest.mark.slow
def test_ablation_and_baseline_report(tiny_ckpts, capsys) -> None:
    assert main([*ARGS, "--model", str(tiny_ckpts["llama"]), "--ablate"]) == 0
    out = capsys.readouterr().out
    ours = tok_s(out, "radixserve")
    assert ours > 0
    for label in ("  overlap off", "  cuda graphs off", "  naive cache"):
        assert tok_s(out, label) > 0
    assert "cache naive" in out and "overlap off" in out
    hf = tok_s(out, "transformers generate")
    ratio = float(re.search(r"ratio radixserve/transformers\s+([\d.]+)x", out).group(1))
    assert ratio == pytest.approx(ours / hf, rel=0.01)


@pytest.mark.slow
def test_tp2_runs_each_configuration_in_its_own_group(tiny_ckpts, capsys) -> None:
    argv = [*ARGS, "--model", str(tiny_ckpts["qwen3"]), "--tp", "2", "--baseline", "none", "--ablate"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("tp 2,") == 4  # radixserve and its three ablations, each a fresh TP group
    assert tok_s(out, "radixserve") > 0
    assert "transformers" not in out


@pytest.mark.slow
@pytest.mark.parametrize("warmup", [2, 0])
def test_shared_prefix_radix_computes_under_an_eighth_of_naive(tmp_path, capsys, warmup) -> None:
    """The issue's case, N = 1,024 and 64 requests, on a tiny model: the radix cache computes the
    system prompt once (in the warm-up, or with none, in the first request while the others wait
    for it) and then only the suffixes; the naive cache all of it."""
    from radixserve.testing import write_tiny_checkpoint

    model = write_tiny_checkpoint("llama", tmp_path / "llama", max_position_embeddings=2048)
    argv = ["bench", "offline", "--model", str(model), "--device", "cpu", "--dtype", "float32",
            "--shared-prefix", "1024", "--num-prompts", "64", "--input-len", "8", "24",
            "--output-len", "2", "2", "--warmup", str(warmup)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "64 requests sharing a 1024-token system prompt" in out
    computed = {cache: int(re.search(rf"^radixserve cache {cache} .* prefill tokens computed\s+(\d+)",
                                     out, re.MULTILINE).group(1)) for cache in ("radix", "naive")}
    prompts = int(re.search(r"\((\d+) prompt tokens\)", out).group(1))
    assert computed["naive"] == prompts  # every prompt token, every request
    system = 1024 if warmup == 0 else 0  # computed in the timed region
    assert system + 64 * 8 <= computed["radix"] <= system + 64 * 24  # (and the suffixes)
    assert computed["radix"] * 8 <= computed["naive"]
    assert tok_s(out, "radixserve cache radix") > 0 and tok_s(out, "radixserve cache naive") > 0
    # the CPU default chunk: the 1,024-token system prompt goes over several steps
    assert "cache radix, page 1, prefill chunk 512" in out and "cache naive, page 1" in out


def test_shared_prefix_workload_shares_only_the_system_prompt() -> None:
    from radixserve.bench.workload import shared_prefix_workload

    reqs = shared_prefix_workload(5, 100, (3, 9), (4, 4), 1000, seed=0)
    warm = shared_prefix_workload(3, 100, (3, 9), (4, 4), 1000, seed=1)
    prefix = reqs[0].input_ids[:100]
    assert all(r.input_ids[:100] == prefix and 103 <= len(r.input_ids) <= 109 for r in reqs + warm)
    assert len({tuple(r.input_ids[100:]) for r in reqs + warm}) == 8  # suffixes all differ
    assert shared_prefix_workload(5, 100, (3, 9), (4, 4), 1000, seed=0) == reqs  # reproducible


def test_compare_kv_dtype_runs_both_caches(tiny_ckpts, capsys) -> None:
    argv = [*ARGS, "--model", str(tiny_ckpts["qwen3"]), "--kv-cache-dtype", "fp8_e4m3",
            "--compare-kv-dtype", "auto", "--baseline", "none"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    fp8, plain = tok_s(out, "radixserve"), tok_s(out, "radixserve kv-cache auto")
    assert "kv fp8_e4m3" in out and "kv float32" in out
    ratio = float(re.search(r"ratio --kv-cache-dtype\s+([\d.]+)x \(fp8_e4m3 / auto\)", out).group(1))
    assert ratio == pytest.approx(fp8 / plain, rel=0.01)


def test_shared_prefix_refuses_the_other_comparisons(tiny_ckpts) -> None:
    with pytest.raises(SystemExit, match="--shared-prefix compares"):
        main([*ARGS, "--model", str(tiny_ckpts["llama"]), "--shared-prefix", "16", "--ablate"])


@pytest.mark.slow
def test_repeat_compares_medians_of_fresh_runs(tiny_ckpts, capsys) -> None:
    """`--repeat 3`: each configuration timed three times, each in its own engine (its own
    description line), and the ratio taken between the medians."""
    argv = [*ARGS, "--model", str(tiny_ckpts["qwen3"]), "--kv-cache-dtype", "fp8_e4m3",
            "--compare-kv-dtype", "auto", "--baseline", "none", "--repeat", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for label, kv in (("radixserve", "kv fp8_e4m3"), ("radixserve kv-cache auto", "kv float32")):
        runs = [float(v) for v in re.findall(rf"^{re.escape(label)}\s+([\d.]+) output tok/s.*{kv}",
                                             out, re.MULTILINE)]
        assert len(runs) == 3
        median = tok_s(out, f"{label} (median)")
        assert median == pytest.approx(sorted(runs)[1], abs=0.06)
        assert f"of 3 runs: {min(runs):.1f} to {max(runs):.1f}" in out
    fp8, plain = tok_s(out, "radixserve (median)"), tok_s(out, "radixserve kv-cache auto (median)")
    ratio = float(re.search(r"ratio --kv-cache-dtype\s+([\d.]+)x", out).group(1))
    assert ratio == pytest.approx(fp8 / plain, rel=0.01)


def test_phases_split_the_timed_run_by_kind_of_step(tiny_ckpts, capsys) -> None:
    """`--phases` with no warm-up, 7 requests of 12 tokens each: one row of prefill batches
    holding every prompt token of the workload (none cached), then the decode steps, 11 or 12
    (overlap may launch one past the end), all in the 1-16 band; the rows add up to the total.
    On CPU nothing runs behind the host, so each row's host time is most of its step time."""
    from transformers import AutoConfig

    from radixserve.bench.workload import random_workload

    path = tiny_ckpts["llama"]
    argv = ["bench", "offline", "--device", "cpu", "--dtype", "float32", "--num-prompts", "7",
            "--input-len", "4", "40", "--output-len", "12", "12", "--warmup", "0",
            "--baseline", "none", "--model", str(path), "--phases"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {m[0]: m[1:] for m in re.findall(
        r"^    (prefill|decode \S+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)%\s+([\d.]+)\s+([\d.]+)\s+(\d*)"
        r"\s+([\d.]+)\s*([\d.]*)$", out, re.MULTILINE)}
    assert set(rows) == {"prefill", "decode 1-16"}, out
    vocab = AutoConfig.from_pretrained(path).vocab_size
    prompts = sum(len(r.input_ids) for r in random_workload(7, (4, 40), (12, 12), vocab, seed=0))
    assert int(rows["prefill"][5]) == prompts
    assert 11 <= int(rows["decode 1-16"][0]) <= 12
    # the KV read rate is printed for decode rows only (their steps are decode attention)
    assert rows["prefill"][7] == "" and float(rows["decode 1-16"][7]) >= 0
    for steps, _, _, ms, host, *_ in rows.values():  # (the host's time lies within the step's)
        assert 0.5 * float(ms) < float(host) <= float(ms) + 0.02, (steps, ms, host)
    total = float(re.search(r"^    all\s+\d+\s+([\d.]+)$", out, re.MULTILINE).group(1))
    assert sum(float(r[1]) for r in rows.values()) == pytest.approx(total, abs=2e-3)
    assert sum(float(r[2]) for r in rows.values()) == pytest.approx(100, abs=0.2)


@pytest.mark.parametrize("overlap,mixed", [(False, True), (False, False), (True, True)],
                         ids=["mixed", "unmixed", "overlap"])
def test_phases_count_the_kv_each_decode_row_reads(tiny_ckpts, overlap: bool, mixed: bool) -> None:
    """A request of n prompt tokens and m output tokens makes m - 1 decode rows (its first token
    comes from its prefill), and the row of its t-th token attends over n + t tokens' KV, whether
    the rows ride in prefill batches (mixed) or not. Overlap may launch one row past a request's
    end. The bytes are those tokens times the KV bytes of a token over all layers (float32)."""
    from transformers import AutoConfig

    from radixserve.bench.offline import run_scheduler
    from radixserve.bench.phases import StepPhases
    from radixserve.bench.workload import random_workload
    from radixserve.config import EngineConfig, SchedulerConfig
    from radixserve.scheduler.scheduler import Scheduler

    path = tiny_ckpts["llama"]
    cfg = AutoConfig.from_pretrained(path)
    reqs = random_workload(6, (3, 30), (2, 9), cfg.vocab_size, seed=1)
    sched = Scheduler(EngineConfig(model=str(path), dtype="float32", device="cpu"),
                      SchedulerConfig(max_running_requests=4, max_prefill_length=16,
                                      overlap=overlap, mixed_chunk=mixed))
    phases = StepPhases.on(sched.device, sched.engine.kv_bytes_per_token)
    run_scheduler(sched, reqs, phases=phases)
    read = sum(r.kv_tokens for r in phases.rows().values())
    want = sum(len(r.input_ids) + t for r in reqs for t in range(1, r.output_len))
    if overlap:
        assert want <= read <= want + sum(len(r.input_ids) + r.output_len for r in reqs)
    else:
        assert read == want
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    assert phases.kv_bytes_per_token == cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2 * 4
    if mixed and not overlap:  # some decode rows rode in a chunked prompt's batch
        assert phases.rows()["prefill"].kv_tokens > 0


def test_step_kinds_band_decode_batches() -> None:
    from radixserve.bench.phases import step_kind

    assert step_kind(5, 300) == "prefill"
    assert [step_kind(0, n) for n in (1, 16, 17, 64, 65, 256, 257)] == [
        "decode 1-16", "decode 1-16", "decode 17-32", "decode 33-64", "decode 65-128",
        "decode 129-256", "decode 257+"]


def test_repeat_must_be_positive(tiny_ckpts) -> None:
    with pytest.raises(SystemExit, match="--repeat must be at least 1, got 0"):
        main([*ARGS, "--model", str(tiny_ckpts["llama"]), "--repeat", "0"])


def test_dummy_quantization_runs_each_on_the_same_requests(tiny_ckpts, capsys) -> None:
    """`--dummy-quantization none fp8`: the 16-bit weights first, then the block-FP8 config's, each
    timed on the same workload, with the second's throughput over the first's."""
    argv = [*ARGS, "--model", str(tiny_ckpts["qwen3"]), "--dummy-weights", "--baseline", "none",
            "--dummy-quantization", "none", "fp8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("workload: 6 requests") == 1
    plain, fp8 = tok_s(out, "radixserve"), tok_s(out, "radixserve weights fp8")
    ratio = float(re.search(r"^ratio weights\s+([\d.]+)x \(fp8 / none\)", out, re.MULTILINE).group(1))
    # (the tok/s printed are rounded to 0.1: the ratio of the printed figures is off by that much)
    assert ratio == pytest.approx(fp8 / plain, abs=5e-4 + fp8 / plain * (0.05 / plain + 0.05 / fp8))


def test_dummy_quantization_is_checked_before_any_run(tiny_ckpts, capsys) -> None:
    model = str(tiny_ckpts["qwen3"])
    with pytest.raises(SystemExit, match="needs --dummy-weights"):
        main([*ARGS, "--model", model, "--dummy-quantization", "fp8"])
    with pytest.raises(SystemExit, match="several --dummy-quantization"):
        main([*ARGS, "--model", model, "--dummy-weights", "--shared-prefix", "16",
              "--dummy-quantization", "none", "fp8"])
    assert "output tok/s" not in capsys.readouterr().out


def _figures(out: str, label: str, *names: str) -> list[float]:
    line = next(ln for ln in out.splitlines() if ln.startswith(label))
    return [float(re.search(rf"{name}\s+([\d.]+)", line).group(1)) for name in names]


@pytest.mark.slow
def test_compare_admission_runs_both_on_a_quarter_of_the_worst_case(tiny_ckpts, capsys) -> None:
    argv = ["bench", "offline", "--model", str(tiny_ckpts["llama"]), "--device", "cpu", "--dtype",
            "float32", "--compare-admission", "--num-prompts", "24", "--input-len", "4", "40",
            "--output-len", "4", "60", "--max-tokens", "256", "--warmup", "2"]
    assert main(argv) == 0  # (each run asserts every answer ended at its forced EOS)
    out = capsys.readouterr().out
    assert "= 0.250 of the worst case" in out
    opt_running, = _figures(out, "radixserve admission optimistic", "mean running")
    res_running, res_retracted = _figures(out, "radixserve admission reserve", "mean running",
                                          "retractions")
    assert opt_running > res_running and res_retracted == 0
    assert "ratio optimistic/reserve" in out


@pytest.mark.slow
def test_multi_turn_host_tier_computes_fewer_prefill_tokens(tiny_ckpts, capsys) -> None:
    argv = ["bench", "offline", "--model", str(tiny_ckpts["llama"]), "--device", "cpu", "--dtype",
            "float32", "--multi-turn", "8", "4", "--history-len", "96"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    off, off_hits = _figures(out, "radixserve host tier off", "computed", "host hits")
    on, on_hits = _figures(out, "radixserve host tier on", "computed", "host hits")
    assert off_hits == 0 and on_hits > 0 and on < off
    assert "8 conversations x 4 turns" in out and "(0.250 of it)" in out
