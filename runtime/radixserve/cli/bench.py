"""`radixserve bench offline|latency|online`."""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics

from radixserve import settings
from radixserve.config import KV_CACHE_DTYPE_CHOICES, add_engine_args

BATCH_SIZES = [1, 8, 64, 256]  # decode batch sizes timed by `latency` and `allreduce`


def _add_shape_args(p: argparse.ArgumentParser) -> None:
    """What `offline` and `latency` share: the model's shape and weights, and the all-reduce."""
    p.add_argument("--model-preset", default=None,
                   help="a model shape, e.g. qwen3-0.6b (with --dummy-weights)")
    p.add_argument("--dummy-weights", action="store_true",
                   help="random weights of the model's exact shapes")
    p.add_argument("--dummy-quantization", nargs="+", default=["none"], choices=["none", "fp8"],
                   help="with --dummy-weights: the linear weights in the model dtype (none) or "
                        "block FP8 (fp8: e4m3 with random 128x128 block scales, as a Hugging "
                        "Face fp8 checkpoint; kept FP8 for a 16-bit model on CUDA); several run "
                        "in turn, e.g. --dummy-quantization none fp8 (offline: on the same "
                        "requests, each compared with the first)")
    p.add_argument("--dummy-loras", type=int, default=0, metavar="N",
                   help="then run again with N random LoRA adapters (PEFT files of the model's "
                        "shapes, rank --max-lora-rank, default 16, on every linear projection), "
                        "the requests spread over them, and compare with the base model's run")
    p.add_argument("--allreduce", nargs="+", default=None, metavar="MODE",
                   help="at --tp > 1, one run per all-reduce mode (auto, nccl, one_shot, "
                        "two_shot; sets RADIXSERVE_ALLREDUCE), e.g. --allreduce auto nccl")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bsub = p.add_subparsers(dest="bench", required=True)
    off = bsub.add_parser("offline", help="offline throughput (output tokens/s)")
    add_engine_args(off)
    _add_shape_args(off)
    off.add_argument("--num-prompts", type=int, default=None,
                     help="requests (default: 256 with --model-preset, else 64)")
    off.add_argument("--input-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                     help="prompt tokens (default: 100 1024 with --model-preset, else 32 256)")
    off.add_argument("--output-len", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                     help="output tokens (default: 100 1024 with --model-preset, else 64 64)")
    off.add_argument("--baseline", choices=["transformers", "none"], default="transformers")
    off.add_argument("--baseline-batch-size", type=int, default=64)
    off.add_argument("--ablate", action="store_true", help="rerun without overlap, CUDA graphs, radix cache")
    off.add_argument("--warmup", type=int, default=16, help="requests run before the timed region")
    off.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="time each configuration N times, each in a fresh engine, and compare their "
                          "medians (on the H200 one configuration's runs minutes apart spread by up to 6%%)")
    off.add_argument("--compare-kv-dtype", default=None, metavar="DTYPE",
                     choices=KV_CACHE_DTYPE_CHOICES,
                     help="rerun with this --kv-cache-dtype, same requests; print both")
    off.add_argument("--shared-prefix", type=int, default=None, metavar="N",
                     help="requests share an N-token system prompt (--input-len: their own "
                          "suffixes, default 32 128); timed with the radix then the naive cache, "
                          "with the prefill tokens each computed (no transformers baseline)")
    off.add_argument("--compare-admission", action="store_true",
                     help="a chat workload: every request asks --max-tokens but ends at an EOS the "
                          "bench forces at a length drawn from --output-len; the KV pool holds "
                          "--kv-share of the requests' worst case; timed with optimistic admission "
                          "then with worst-case reservation (--kv-admission), with the running "
                          "batch's mean size and the retractions")
    off.add_argument("--multi-turn", type=int, nargs=2, default=None, metavar=("CONVERSATIONS", "TURNS"),
                     help="conversations in a closed loop, each turn the whole history plus a "
                          "question of --input-len tokens, answers of --output-len; the device KV "
                          "pool holds --kv-share of the working set; timed without then with the "
                          "host KV tier, with the prefill tokens computed and TTFT p50/p99")
    off.add_argument("--max-parallel", type=int, default=None, metavar="P",
                     help="--multi-turn: at most P turns in flight, the rest waiting on the "
                          "client's side (TTFT counts from a turn's submission; default: all at once)")
    off.add_argument("--history-len", type=int, default=None, metavar="N",
                     help="--multi-turn: tokens of each conversation's opening history (default: "
                          "2048 with --model-preset, else 128)")
    off.add_argument("--max-tokens", type=int, default=None, metavar="N",
                     help="--compare-admission: the max_tokens every request asks for (default: "
                          "4096 with --model-preset, else 256)")
    off.add_argument("--kv-share", type=float, default=0.25, metavar="F",
                     help="--compare-admission, --multi-turn: the device KV pool as a share of the "
                          "worst-case reservation, or of the working set (unless --max-kv-tokens)")
    off.add_argument("--constrained", action="store_true",
                     help="constrain every request by a JSON schema (--json-schema, else a built-in one)")
    off.add_argument("--json-schema", default=None, metavar="FILE",
                     help="the JSON schema of --constrained / --compare-constrained (implies --constrained)")
    off.add_argument("--compare-constrained", action="store_true",
                     help="run unconstrained, then every request JSON-schema constrained; print both")
    off.add_argument("--compare-mixed-chunk", action="store_true",
                     help="rerun with mixed batches toggled, same requests; print both")
    off.add_argument("--phases", action="store_true",
                     help="after each timed run, where its time went by kind of step: prefill "
                          "batches, and decode steps by batch size (GPU time on a GPU)")
    off.set_defaults(func=run_offline)

    lat = bsub.add_parser("latency", help="decode step time at fixed batch sizes")
    add_engine_args(lat)
    _add_shape_args(lat)
    lat.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    lat.add_argument("--input-len", type=int, default=128)
    lat.add_argument("--steps", type=int, default=64)
    lat.add_argument("--profile", default=None, metavar="DIR",
                     help="after every batch size is timed, profile as many steps of each: a Chrome trace per batch "
                          "size in DIR and the top kernels (CPU ops on CPU) per step")
    lat.add_argument("--breakdown", action="store_true",
                     help="after every batch size is timed, run as many eager steps of each and print "
                          "the forward's time by layer part (GPU time from CUDA events; wall clock on CPU)")
    lat.set_defaults(func=run_latency)

    on = bsub.add_parser("online", help="Poisson arrivals against a running server")
    on.add_argument("--base-url", default="http://127.0.0.1:8000")
    on.add_argument("--served-model", default=None, help="model name (default: the server's first)")
    on.add_argument("--num-prompts", type=int, default=200)
    on.add_argument("--input-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    on.add_argument("--output-len", type=int, nargs=2, default=[100, 1024], metavar=("MIN", "MAX"))
    on.add_argument("--request-rate", type=float, nargs="+", default=[float("inf")],
                    help="requests/s (inf: all at once); several rates run in turn, same requests")
    on.add_argument("--max-concurrency", type=int, default=256)
    on.add_argument("--vocab-size", type=int, default=32000, help="token ids are drawn below this")
    on.add_argument("--text-prompts", action="store_true",
                    help="send text prompts (--input-len counts words) instead of token ids: what a "
                         "router in front of the servers (the SGLang model gateway) accepts")
    on.add_argument("--shared-prefix", type=int, nargs=2, default=None, metavar=("NUM", "WORDS"),
                    help="multi-tenant text prompts: each starts with one of NUM system prompts of "
                         "WORDS words (implies --text-prompts); what a cache-aware router serves well")
    on.add_argument("--seed", type=int, default=0, help="seeds the prompts and the arrival times")
    on.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                    help="bearer token for a server started with --api-key (default: $OPENAI_API_KEY)")
    on.set_defaults(func=run_online_cli)

    spec = bsub.add_parser("speculative", help="output tokens/s with speculative decoding against "
                           "plain decoding, same requests, and what the drafts achieved")
    add_engine_args(spec)
    _add_shape_args(spec)
    spec.add_argument("--workloads", nargs="+", default=["repeat", "chat"], metavar="NAME",
                      help="repeat (the output quotes the prompt), chat (a short story), random "
                           "(random token ids, EOS ignored: for --dummy-weights)")
    spec.add_argument("--batch-sizes", type=int, nargs="+", default=[1],
                      help="requests run together (each group to its end before the next)")
    spec.add_argument("--num-prompts", type=int, default=8)
    spec.add_argument("--max-tokens", type=int, default=128)
    spec.add_argument("--draft-preset", default=None, metavar="NAME",
                      help="--speculative-draft-model-path as a model shape (with --dummy-weights)")
    spec.add_argument("--bracket", type=int, nargs="+", default=None, metavar="K",
                      help="random workload only: plain decoding, then the ceiling (a drafter "
                           "replaying plain decoding's tokens: all kept, free to draft) and the "
                           "floor (none kept) with K draft tokens, for each K given")
    spec.set_defaults(func=run_speculative)
    hc = bsub.add_parser("host-copy", help="the host KV tier's copy rate (GB/s) both ways against "
                         "a plain pinned copy (CUDA)")
    hc.add_argument("--layers", type=int, default=36, help="default: Qwen3-8B's shapes")
    hc.add_argument("--kv-heads", type=int, default=8, help="KV heads on one rank")
    hc.add_argument("--head-dim", type=int, default=128)
    hc.add_argument("--kv-dtype", choices=KV_CACHE_DTYPE_CHOICES[1:], default="bfloat16")
    hc.add_argument("--tokens", type=int, nargs="+", default=[2048, 16384],
                    help="tokens per copy; several run in turn")
    hc.add_argument("--tokens-per-page", type=int, default=16)
    hc.add_argument("--runs", type=int, default=4,
                    help="runs of consecutive host pages the copy's pages fall in")
    hc.set_defaults(func=run_host_copy)

    ar = bsub.add_parser("allreduce", help="all-reduce time per decode step (CUDA graphs): NCCL "
                         "against the symmetric-memory one-shot/two-shot kernels")
    ar.add_argument("--tp", type=int, default=2, help="GPUs (one process each)")
    ar.add_argument("--batch-sizes", type=int, nargs="+", default=BATCH_SIZES)
    ar.add_argument("--hidden", type=int, default=5120, help="hidden size (default: Qwen3-14B)")
    ar.add_argument("--layers", type=int, default=40, help="layers per decode step (2 all-reduces each)")
    ar.add_argument("--impl", nargs="+", default=sorted(settings.ALLREDUCE.choices, key=lambda m: m == "auto"),
                    help="implementations to time: nccl, one_shot, two_shot, auto (the engine's pick)")
    ar.set_defaults(func=run_allreduce)


def _engine_configs(args: argparse.Namespace):
    import dataclasses

    if args.dummy_loras < 0:
        raise SystemExit(f"bench: --dummy-loras must be at least 0, got {args.dummy_loras}")
    from radixserve.bench.presets import preset_dir
    from radixserve.cli.preflight import engine_configs

    if args.model_preset:
        if not args.dummy_weights:
            raise SystemExit("--model-preset has no weights: add --dummy-weights")
        args.model = str(preset_dir(args.model_preset))
    eng, sch = engine_configs(args)
    if args.dummy_weights:
        eng = dataclasses.replace(eng, load_format="dummy")
    return eng, sch


@contextlib.contextmanager
def _lora_engine(eng, count: int):
    """(engine config serving `count` dummy adapters, their names), the adapters written to a
    temporary directory removed on exit."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from radixserve.bench.lora import DEFAULT_RANK, write_dummy_adapters
    from radixserve.models.default_model import resolve_model_path

    rank = eng.max_lora_rank or DEFAULT_RANK
    with tempfile.TemporaryDirectory(prefix="radixserve-loras-") as tmp:
        paths = write_dummy_adapters(resolve_model_path(eng.model), Path(tmp), count, rank)
        print(f"LoRA: {count} dummy adapters of rank {rank} on every linear projection, "
              f"{eng.max_loras_per_batch} slots; the requests spread over them in turn", flush=True)
        yield (dataclasses.replace(eng, max_lora_rank=rank,
                                   lora_paths=tuple(f"{n}={p}" for n, p in paths.items())),
               list(paths))


def _allreduce_modes(args: argparse.Namespace, tp: int) -> list[str | None]:
    """The `--allreduce` modes to run in turn (None: leave RADIXSERVE_ALLREDUCE as it is);
    checked before any process starts."""
    from radixserve.distributed.allreduce_choice import ENV, MODES

    modes = args.allreduce or [None]
    if bad := [m for m in modes if m is not None and m not in MODES]:
        raise SystemExit(f"bench: --allreduce takes {', '.join(MODES)}, got {', '.join(bad)}")
    if args.allreduce and tp < 2:
        raise SystemExit("bench: --allreduce needs --tp 2 or more (TP=1 has no all-reduce)")
    if os.environ.get(ENV) and args.allreduce:
        raise SystemExit(f"bench: --allreduce and {ENV} are both set; use one")
    return modes


@contextlib.contextmanager
def _env(name: str, value: str | None):
    old = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None:
            os.environ.pop(name) if old is None else os.environ.__setitem__(name, old)


def run_latency(args: argparse.Namespace) -> int:
    import dataclasses
    import gc

    eng, sch = _engine_configs(args)  # the flags first: a mistake answers before torch loads
    import torch

    from radixserve.bench.breakdown import format_breakdown
    from radixserve.bench.latency import decode_step_detail, decode_step_ms
    from radixserve.bench.offline import allreduce_desc
    from radixserve.bench.weight_bound import bound_ms, copy_bandwidth, weight_bytes_per_step
    from radixserve.distributed.allreduce_choice import ENV
    from radixserve.engine.device import resolve_device
    from radixserve.scheduler.tp import scheduler_group

    modes = _allreduce_modes(args, eng.tp)
    if args.breakdown and eng.tp > 1:  # rank 0's hooks only, while its followers replay graphs
        raise SystemExit("bench latency: --breakdown times one process; run it with --tp 1")
    engines = _quantized_variants(eng, args.dummy_quantization, args.dummy_weights)
    sch = dataclasses.replace(sch, max_running_requests=max(sch.max_running_requests, *args.batch_sizes))
    # the device's copy rate, measured before any engine holds its memory
    bandwidth = copy_bandwidth(resolve_device(eng.device))
    base_ms: dict[int, float] = {}  # the first configuration's step per batch size
    for (quant, eng), mode in itertools.product(engines, modes):
        with _env(ENV, mode), scheduler_group(eng, sch) as sched:
            tp = f", tp {eng.tp} ({allreduce_desc()})" if eng.tp > 1 else ""
            weights = ""
            if quant == "fp8":  # kept FP8 on CUDA in 16 bits; elsewhere the model dtype's
                kept = sum(p.dtype == torch.float8_e4m3fn for p in sched.engine.model.parameters())
                weights = f", block-FP8 config: {kept} weights FP8"
            print(f"decode step, input {args.input_len} tokens, {args.steps} steps, {sched.device} "
                  f"({sched.engine.dtype}{weights}){tp}, "
                  f"attention {type(sched.engine.attn_backend).__name__}, "
                  f"CUDA graphs {'on' if sched.engine.graph_runner else 'off'}, overlap "
                  f"{'on' if sched.overlap else 'off'}", flush=True)
            weight_bytes = weight_bytes_per_step(sched.engine.model)
            bound = bound_ms(weight_bytes, bandwidth)
            for i, bs in enumerate(args.batch_sizes):
                ms = decode_step_ms(sched, bs, args.input_len, args.steps, uid0=i * 100_000)
                base_ms.setdefault(bs, ms)
                line = f"batch {bs:>4}: {ms:8.3f} ms/step  {bs * 1000 / ms:10.1f} tok/s"
                if bs == 1:
                    line += (f"  {bound / ms:4.0%} of the weight-read bound ({weight_bytes / 1e9:.4g}"
                             f" GB a step at {bandwidth / 1e12:.4g} TB/s copy: {bound:.4g} ms)")
                print(line, flush=True)
            for i, bs in enumerate(args.batch_sizes if args.profile or args.breakdown else []):
                print(f"batch {bs:>4}, more steps after every timed batch size:", flush=True)
                parts = decode_step_detail(sched, bs, args.input_len, args.steps,
                                           uid0=(len(args.batch_sizes) + i) * 100_000,
                                           profile_dir=args.profile, breakdown=args.breakdown)
                if parts is not None:
                    print(format_breakdown(parts, sched.device.type == "cuda"), flush=True)
            del sched
        # NOTE: without this the next mode's engine found no memory for its KV cache (two H200s,
        # Qwen3-14B at TP=2: "budget -2.37 GiB"), when the engine and its graph runner referred
        # to each other; kept so no cycle left elsewhere holds the last run's memory
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.dummy_loras:
        with _lora_engine(engines[0][1], args.dummy_loras) as (eng, names), \
                scheduler_group(eng, sch) as sched:
            for i, bs in enumerate(args.batch_sizes):
                ms = decode_step_ms(sched, bs, args.input_len, args.steps,
                                    uid0=(2 * len(args.batch_sizes) + i) * 100_000, loras=names)
                print(f"batch {bs:>4} LoRA: {ms:8.3f} ms/step  {bs * 1000 / ms:10.1f} tok/s  "
                      f"{ms / base_ms[bs]:.3f}x the base model's step", flush=True)
    return 0


def _quantized_variants(eng, quants: list[str], dummy: bool) -> list[tuple[str, object]]:
    """(quantization, engine config) for each `--dummy-quantization`, checked before any run."""
    import dataclasses

    from radixserve.bench.presets import fp8_block_dir

    if quants != ["none"] and not dummy:
        raise SystemExit("bench: --dummy-quantization needs --dummy-weights")
    if "fp8" in quants and eng.model is None:
        raise SystemExit("bench: --dummy-quantization fp8 needs --model or --model-preset")
    return [(q, dataclasses.replace(eng, model=str(fp8_block_dir(eng.model))) if q == "fp8" else eng)
            for q in quants]


def run_host_copy(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench host-copy: needs CUDA (on CPU the host tier is the same memory)")
    from radixserve.bench.host_copy import copy_rates
    from radixserve.kvcache.kv_dtype import KV_CACHE_DTYPES

    dtype = KV_CACHE_DTYPES[args.kv_dtype]
    print(f"host KV tier copies on {torch.cuda.get_device_name()}: {args.layers} layers x "
          f"{args.kv_heads} KV heads x {args.head_dim}, {args.kv_dtype}, pages of "
          f"{args.tokens_per_page}, host pages in {args.runs} runs", flush=True)
    for tokens in args.tokens:
        r = copy_rates(args.layers, args.kv_heads, args.head_dim, dtype, tokens,
                       args.tokens_per_page, args.runs)
        print(f"{tokens:>7} tokens ({r['bytes'] / 2**20:8.1f} MiB): to host {r['tier to host']:6.1f} "
              f"GB/s (plain {r['plain to host']:6.1f}), to device {r['tier to device']:6.1f} GB/s "
              f"(plain {r['plain to device']:6.1f})", flush=True)
    return 0


def run_allreduce(args: argparse.Namespace) -> int:
    from radixserve.bench.allreduce import AllReduceBench, require_devices, run_allreduce_bench

    try:
        bench = AllReduceBench(args.tp, tuple(args.batch_sizes), args.hidden, args.layers,
                               impls=tuple(args.impl))
        require_devices(bench.tp)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"bench allreduce: {e}") from None
    run_allreduce_bench(bench)
    return 0


def _served_model(base_url: str, wanted: str | None, api_key: str | None) -> str:
    """The model to ask for, checked against the server's `/v1/models`; SystemExit if unusable."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    url = f"{base_url.rstrip('/')}/v1/models"
    try:
        r = httpx.get(url, headers=headers, timeout=30)
    except httpx.HTTPError as e:
        raise SystemExit(f"bench online: cannot reach the server at {base_url}: {e}") from None
    if r.status_code != 200:
        raise SystemExit(f"bench online: GET {url} answered HTTP {r.status_code}: {r.text[:300]}")
    try:
        cards = r.json()["data"]
    except (ValueError, KeyError, TypeError):
        cards = []
    if not cards:
        raise SystemExit(f"bench online: GET {url} lists no models")
    if wanted is None:
        return cards[0]["id"]
    if not any(wanted in (c.get("id"), c.get("root")) for c in cards):
        served = ", ".join(c["id"] for c in cards)
        raise SystemExit(f"bench online: the server at {base_url} does not serve model {wanted!r} "
                         f"(it serves: {served})")
    return wanted


def run_online_cli(args: argparse.Namespace) -> int:
    import asyncio

    from radixserve.bench.online import report, run_online
    from radixserve.bench.workload import random_workload, text_workload

    if not all(r > 0 for r in args.request_rate) or args.max_concurrency < 1 or args.num_prompts < 1:
        raise SystemExit("bench online: --request-rate must be > 0, "
                         "--max-concurrency and --num-prompts at least 1")
    model = _served_model(args.base_url, args.served_model, args.api_key)
    in_rng, out_rng = tuple(args.input_len), tuple(args.output_len)
    if args.text_prompts or args.shared_prefix:
        num, words = args.shared_prefix or (0, 0)
        reqs = text_workload(args.num_prompts, in_rng, out_rng, args.seed, num, words)
        kind = f"text prompts ({num} system prompts of {words} words, then)" if num else "text prompts"
    else:
        reqs = random_workload(args.num_prompts, in_rng, out_rng, args.vocab_size, args.seed)
        kind = "token-id prompts"
    ok = True
    for rate in args.request_rate:
        print(f"online: {args.num_prompts} requests, {kind} input {in_rng}, output {out_rng}, rate "
              f"{rate}/s, max concurrency {args.max_concurrency}, seed {args.seed}, "
              f"ignore_eos; {args.base_url} ({model})", flush=True)
        results, secs = asyncio.run(run_online(args.base_url, model, reqs, rate,
                                               args.max_concurrency, args.seed, args.api_key))
        print(report(results, secs), flush=True)
        ok = ok and all(r.ok for r in results)
    return 0 if ok else 1


def run_speculative(args: argparse.Namespace) -> int:
    import dataclasses

    from radixserve.bench import speculative as bench
    from radixserve.bench.presets import preset_dir
    from radixserve.scheduler.tp import scheduler_group

    if args.draft_preset:
        if not args.dummy_weights:
            raise SystemExit("bench: --draft-preset has no weights: add --dummy-weights")
        args.speculative_draft_model_path = str(preset_dir(args.draft_preset))
    eng, sch = _engine_configs(args)
    if not sch.speculates:
        raise SystemExit("bench speculative: give --speculative-algorithm (and its options)")
    if bad := sorted(set(args.workloads) - set(bench.WORKLOADS)):
        raise SystemExit(f"bench speculative: --workloads takes {', '.join(bench.WORKLOADS)}, got {bad}")
    if args.bracket:
        if args.workloads != ["random"]:
            raise SystemExit("bench speculative: --bracket runs the random workload: add --workloads random")
        # (the engine's verification graphs cover the most draft tokens bracketed)
        sch = dataclasses.replace(sch, speculative_num_draft_tokens=max(args.bracket))
        with scheduler_group(eng, sch) as sched:
            reqs = bench.workload("random", sched.model_path, args.num_prompts, args.max_tokens,
                                  sched.vocab_size)
            bench.bracket(sched, reqs, args.batch_sizes, args.bracket)
        return 0
    plain = dataclasses.replace(sch, speculative_algorithm="none", speculative_draft_model_path=None)
    runs: dict[str, list] = {}
    for label, cfg in (("plain", plain), (sch.speculative_algorithm, sch)):
        with scheduler_group(eng, cfg) as sched:
            for name in args.workloads:
                reqs = bench.workload(name, sched.model_path, args.num_prompts, args.max_tokens,
                                      sched.vocab_size)
                bench.warm(sched, reqs)
                for bs in args.batch_sizes:
                    r = bench.run(sched, reqs, bs)
                    runs.setdefault(f"{name} batch {bs}", []).append(r)
                    print(f"{name:<7} batch {bs:>4} {label:<7} {r.tokens_per_s:10.1f} output tok/s "
                          f"({r.tokens} tokens){'  ' + r.drafts() if cfg.speculates else ''}",
                          flush=True)
    for key, (base, spec_run) in runs.items():
        print(f"{key:<20} speculative/plain {spec_run.tokens_per_s / base.tokens_per_s:6.3f}x  "
              f"{spec_run.drafts()}", flush=True)
    return 0


def _kv_pool(eng, tokens: float):
    """`eng` with a KV pool of `tokens` (whole pages), unless --max-kv-tokens chose one."""
    import dataclasses

    if eng.max_kv_tokens is not None:
        return eng
    return dataclasses.replace(eng, max_kv_tokens=max(eng.page_size, int(tokens)))


def _compare_admission(args, eng, sch, n, in_rng, out_rng, vocab, big, path, hf_config) -> int:
    from radixserve.bench.admission import run_admission_compare, worst_case_tokens
    from radixserve.bench.workload import random_workload
    from radixserve.models.generation import eos_token_ids

    max_tokens = args.max_tokens or (4096 if big else 256)
    if out_rng[1] > max_tokens or out_rng[0] < 1:
        raise SystemExit(f"bench: --output-len (the forced answer lengths) must be in [1, "
                         f"--max-tokens {max_tokens}]")
    eos = sorted(eos_token_ids(path, hf_config))
    if not eos:
        raise SystemExit("bench: --compare-admission forces the model's EOS; this model has none")
    reqs = random_workload(n, in_rng, out_rng, vocab, seed=0)
    worst = worst_case_tokens(reqs, max_tokens)
    eng = _kv_pool(eng, args.kv_share * worst)
    print(f"workload: {n} chat requests, input {in_rng}, max_tokens {max_tokens}, EOS forced at "
          f"{out_rng}, seed 0; KV pool {eng.max_kv_tokens} tokens = {eng.max_kv_tokens / worst:.3f} "
          f"of the worst case ({worst}); model {args.model_preset or path}", flush=True)
    run_admission_compare(eng, sch, reqs, max_tokens, eos[0], args.warmup)
    return 0


def _multi_turn(args, eng, sch, vocab, big, path) -> int:
    from radixserve.bench.multi_turn import conversations, run_multi_turn, working_set

    num, turns = args.multi_turn
    if num < 1 or turns < 1:
        raise SystemExit("bench: --multi-turn needs at least one conversation and one turn")
    if args.max_parallel is not None and args.max_parallel < 1:
        raise SystemExit(f"bench: --max-parallel takes a positive count, got {args.max_parallel}")
    history = args.history_len if args.history_len is not None else (2048 if big else 128)
    q_rng = tuple(args.input_len or ((64, 256) if big else (8, 32)))
    a_rng = tuple(args.output_len or ((64, 256) if big else (4, 16)))
    convs = conversations(num, turns, history, q_rng, a_rng, vocab, seed=0)
    ws = working_set(convs)
    eng = _kv_pool(eng, args.kv_share * ws)
    print(f"workload: {num} conversations x {turns} turns, {history}-token openings, questions "
          f"{q_rng}, answers {a_rng}, seed 0, ignore_eos; working set {ws} tokens, device KV pool "
          f"{eng.max_kv_tokens} tokens ({eng.max_kv_tokens / ws:.3f} of it); model "
          f"{args.model_preset or path}; turns in flight "
          f"{args.max_parallel or 'unbounded'}", flush=True)
    run_multi_turn(eng, sch, convs, args.max_parallel)
    return 0


def run_offline(args: argparse.Namespace) -> int:
    import dataclasses

    eng, sch = _engine_configs(args)  # the flags first: a mistake answers before torch loads
    import torch

    from radixserve.bench.baseline import load_hf_model, run_transformers
    from radixserve.bench.offline import bench_config
    from radixserve.bench.workload import random_workload

    modes = _allreduce_modes(args, eng.tp)
    variants = _quantized_variants(eng, args.dummy_quantization, args.dummy_weights)
    eng = variants[0][1]  # the ablations, comparisons and baseline run the first
    big = args.model_preset is not None
    n = args.num_prompts or (256 if big else 64)
    in_rng = tuple(args.input_len or ((100, 1024) if big else (32, 256)))
    out_rng = tuple(args.output_len or ((100, 1024) if big else (64, 64)))

    from transformers import AutoConfig

    from radixserve.models.default_model import resolve_model_path
    from radixserve.models.hf_config import text_config

    path = resolve_model_path(eng.model)
    hf_config = AutoConfig.from_pretrained(path)
    vocab = text_config(hf_config).vocab_size
    if args.repeat < 1:
        raise SystemExit(f"bench: --repeat must be at least 1, got {args.repeat}")
    if args.max_parallel is not None and not args.multi_turn:
        raise SystemExit("bench: --max-parallel bounds the turns of --multi-turn: add it")
    if args.shared_prefix is not None:
        from radixserve.bench.shared_prefix import run_shared_prefix

        if args.shared_prefix < 1:
            raise SystemExit("bench: --shared-prefix must be at least 1")
        if (args.ablate or args.compare_kv_dtype or args.compare_constrained or args.compare_mixed_chunk
                or args.allreduce or args.repeat > 1 or args.phases or len(variants) > 1):
            raise SystemExit("bench: --shared-prefix compares the radix and naive caches; run --ablate, "
                             "--compare-*, --allreduce, --repeat, --phases and several "
                             "--dummy-quantization without it")
        suffix = tuple(args.input_len or (32, 128))
        run_shared_prefix(eng, sch, args.shared_prefix, n, suffix, out_rng, vocab, args.warmup)
        return 0
    if args.compare_admission or args.multi_turn:
        if (args.ablate or args.compare_kv_dtype or args.compare_constrained or args.compare_mixed_chunk
                or args.allreduce or args.repeat > 1 or args.phases or len(variants) > 1
                or (args.compare_admission and args.multi_turn)):
            raise SystemExit("bench: --compare-admission and --multi-turn each compare two "
                             "configurations; run them alone (without --ablate, --compare-*, "
                             "--allreduce, --repeat, --phases, several --dummy-quantization)")
        if not 0 < args.kv_share <= 1:
            raise SystemExit(f"bench: --kv-share must be in (0, 1], got {args.kv_share}")
        if args.compare_admission:
            return _compare_admission(args, eng, sch, n, in_rng, out_rng, vocab, big, path, hf_config)
        return _multi_turn(args, eng, sch, vocab, big, path)
    reqs = random_workload(n, in_rng, out_rng, vocab, seed=0)
    print(f"workload: {n} requests, input {in_rng}, output {out_rng}, seed 0, ignore_eos; "
          f"model {args.model_preset or path}")

    from radixserve.bench.constrained import bench_schema

    schema = (bench_schema(args.json_schema)
              if args.constrained or args.json_schema or args.compare_constrained else None)
    main_schema = None if args.compare_constrained else schema

    def run(label: str, e=eng, s=sch, env: dict | None = None, json_schema: str | None = None,
            work: list | None = None) -> float:
        old = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        def report(tps: float, desc: str) -> None:
            print(f"{label:<28} {tps:>10.1f} output tok/s   [{desc}]", flush=True)

        try:
            runs = [bench_config(e, s, work or reqs, args.warmup, report, json_schema,
                                 phases=args.phases)[0] for _ in range(args.repeat)]
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        tps = statistics.median(runs)
        if len(runs) > 1:
            print(f"{label + ' (median)':<28} {tps:>10.1f} output tok/s   [of {len(runs)} runs: "
                  f"{min(runs):.1f} to {max(runs):.1f}]", flush=True)
        return tps

    from radixserve.distributed.allreduce_choice import ENV

    ours = 0.0
    for mode in modes:
        label = "radixserve" if mode is None else f"radixserve allreduce={mode}"
        tps = run(label, env=None if mode is None else {ENV: mode}, json_schema=main_schema)
        ours = ours or tps  # the first mode is the one the ablations and baseline compare with
    if args.dummy_loras:
        from radixserve.bench.lora import spread

        with _lora_engine(eng, args.dummy_loras) as (e, names):
            tps = run(f"radixserve {len(names)} LoRAs", e=e, json_schema=main_schema,
                      work=spread(reqs, names))
        print(f"{'ratio LoRA/base':<28} {tps / ours:>10.3f}x", flush=True)
    for quant, e in variants[1:]:
        tps = run(f"radixserve weights {quant}", e=e, json_schema=main_schema)
        print(f"{'ratio weights':<28} {tps / ours:>10.3f}x ({quant} / {variants[0][0]})", flush=True)
    if args.compare_kv_dtype:
        kv = args.compare_kv_dtype
        tps = run(f"radixserve kv-cache {kv}", e=dataclasses.replace(eng, kv_cache_dtype=kv),
                  json_schema=main_schema)
        print(f"{'ratio --kv-cache-dtype':<28} {ours / tps:>10.3f}x ({eng.kv_cache_dtype} / {kv})",
              flush=True)
    if args.compare_constrained:
        tps = run("radixserve json-schema", json_schema=schema)
        print(f"{'ratio json-schema/plain':<28} {tps / ours:>10.3f}x", flush=True)
    if args.compare_mixed_chunk:
        mixed = not sch.mixed_chunk
        tps = run(f"radixserve mixed chunk {'on' if mixed else 'off'}",
                  s=dataclasses.replace(sch, mixed_chunk=mixed), json_schema=main_schema)
        print(f"{'ratio mixed on/off':<28} {(tps / ours if mixed else ours / tps):>10.3f}x", flush=True)
    if args.ablate:
        for label, kw in [
            ("  overlap off", {"s": dataclasses.replace(sch, overlap=False)}),
            ("  cuda graphs off", {"e": dataclasses.replace(eng, cuda_graph_max_bs=0,
                                                            prefill_graph_max_tokens=0)}),
            ("  naive cache", {"s": dataclasses.replace(sch, cache="naive")}),
        ]:
            tps = run(label, json_schema=main_schema, **kw)
            print(f"{'':<28} {100 * (ours - tps) / tps:>+9.1f}% from the feature")
    if args.baseline == "transformers":
        from radixserve.engine.device import resolve_device
        from radixserve.models.loader import resolve_dtype

        dev = resolve_device(eng.device)
        dtype = resolve_dtype(eng.dtype, hf_config, dev)
        model = load_hf_model(path, dtype, dev, args.dummy_weights)
        pad = model.config.pad_token_id or 0
        secs, toks = run_transformers(model, reqs, args.baseline_batch_size, pad)
        hf = toks / secs
        print(f"{'transformers generate':<28} {hf:>10.1f} output tok/s (batch {args.baseline_batch_size})")
        print(f"{'ratio radixserve/transformers':<28} {ours / hf:>10.3f}x")
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 0
