"""`radixserve bench offline --compare-admission`: a chat workload whose requests all ask for
`max_tokens` but end at a length drawn from `--output-len` (the bench forces EOS there: EOS banned
before it by `min_tokens`, then raised to the top by `logit_bias`, so each answer stops exactly as
a model's EOS would stop it), on a KV pool of `--kv-share` of what reserving every request's worst
case (prompt + max_tokens) would need; timed with optimistic admission, then with worst-case
reservation, in one command: output tokens/s, the running batch's mean size, and retractions."""
from __future__ import annotations

import dataclasses

from radixserve.bench.offline import bench_config
from radixserve.bench.workload import BenchRequest
from radixserve.config import KV_ADMISSION_CHOICES, EngineConfig, SchedulerConfig
from radixserve.sampling_params import SamplingParams

EOS_BIAS = 100.0  # OpenAI's largest logit_bias: above any logit of a real or random model


def forced_eos(eos_id: int, max_tokens: int):
    """Each request's parameters: `max_tokens`, and EOS as its `output_len`-th token."""
    def sampling(r: BenchRequest) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, min_tokens=r.output_len - 1,
                              logit_bias={eos_id: EOS_BIAS})
    return sampling


def worst_case_tokens(reqs: list[BenchRequest], max_tokens: int) -> int:
    return sum(len(r.input_ids) + max_tokens for r in reqs)


def run_admission_compare(eng: EngineConfig, sch: SchedulerConfig, reqs: list[BenchRequest],
                          max_tokens: int, eos_id: int, warmup: int) -> dict[str, dict[str, float]]:
    """Both admissions on the same requests and pool (`eng.max_kv_tokens`), each line printed as
    it lands; returns their figures by admission."""
    runs: dict[str, dict[str, float]] = {}
    for admission in KV_ADMISSION_CHOICES:  # optimistic, then reserve
        stats: dict[str, float] = {}
        tps, desc = bench_config(eng, dataclasses.replace(sch, kv_admission=admission), reqs,
                                 warmup, stats=stats, sampling=forced_eos(eos_id, max_tokens))
        runs[admission] = {"tok_s": tps, **stats}
        print(f"{'radixserve admission ' + admission:<30} {tps:>10.1f} output tok/s   mean running "
              f"{stats['mean_running']:>7.1f}   retractions {stats['retractions']:>5.0f}   "
              f"[{desc}]", flush=True)
    opt, res = runs["optimistic"], runs["reserve"]
    print(f"{'ratio optimistic/reserve':<30} {opt['tok_s'] / res['tok_s']:>10.3f}x throughput, "
          f"{opt['mean_running'] / max(res['mean_running'], 1e-9):.3f}x mean running batch",
          flush=True)
    return runs
