#!/usr/bin/env bash
# The GPU image's Python environment, proven on the GPU machine: the Dockerfile's
# pinned stack (torch for one CUDA, the Triton torch pins, FlashInfer) runs `--attn auto` with no
# nvcc anywhere, as in the image, and generates. Run from the project root on the GPU machine
# (Python 3.12, torch 2.11+cu130, no network), with the wheelhouse of
# /work/shared/tools/device-wheels.sh in ./.whl (carry [".whl"]):
#
#   bash scripts/gpu_image_env.sh
#
# What it does, each phase in its own process, on a tiny random Qwen3 (head_dim 64):
#   0. installs ./.whl as every device run does (no index, no deps; torch, triton and the CUDA
#      wheels are the machine's own) and checks the versions against the Dockerfile's ARG pins;
#   A. "the image": nvcc hidden (PATH mirrored without it, CUDA_HOME unset, or pointed at an
#      empty folder where /usr/local/cuda/bin/nvcc exists, since FlashInfer falls back to that
#      path), a fresh FlashInfer workspace (no JIT cache), LD_LIBRARY_PATH without a CUDA toolkit's
#      runtime: `--attn auto` must pick Triton for prefill (FlashInfer has neither
#      flashinfer-jit-cache, which is over the 64 MiB a run can carry, nor an nvcc), say why in
#      one INFO line, capture decode CUDA graphs and generate;
#   A'. the same environment with `--attn flashinfer,triton` forced: the crash `auto` avoids
#      (FlashInfer must JIT-compile and cannot); reported, not required;
#   B. the machine as it is (nvcc 13.0 on PATH), fresh FlashInfer workspace: `auto` picks
#      FlashInfer prefill (JIT-compiled once, ~20 s) + Triton decode and generates.
# Exit status 0 when 0, A and B hold. A summary (JSON) goes to $OUT/gpu_image_env.json when OUT
# is set (the device run's output folder), else to the work folder it prints.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=$(command -v "${PYTHON:-python3}")
WORK=$(mktemp -d /tmp/radixserve-image-env.XXXXXX)
SUMMARY=${OUT:-$WORK}/gpu_image_env.json
echo "== work folder $WORK"

pin() { sed -n "s/^ARG $1=//p" Dockerfile; }
export PIN_TORCH=$(pin TORCH_VERSION) PIN_TRITON=$(pin TRITON_VERSION)
export PIN_CUDA=$(pin CUDA_VERSION) PIN_FLASHINFER=$(pin FLASHINFER_VERSION)
echo "== Dockerfile pins: torch $PIN_TORCH (CUDA $PIN_CUDA), triton $PIN_TRITON, flashinfer $PIN_FLASHINFER"

# ---------------------------------------------------------------- 0. install and check the pins
ls .whl/flashinfer_python-"$PIN_FLASHINFER"-*.whl >/dev/null 2>&1 \
  || { echo "no .whl/flashinfer_python-$PIN_FLASHINFER-*.whl: run device-wheels.sh, carry .whl"; exit 2; }
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$WORK/site" .whl/*.whl
export PYTHONPATH="$WORK/site:$ROOT/runtime:$ROOT/kernels:$ROOT/operator"
"$PY" - <<'EOF'
import importlib.metadata as m, importlib.util, os, sys
import torch
got = {"torch": m.version("torch"), "torch CUDA": torch.version.cuda, "triton": m.version("triton"),
       "flashinfer-python": m.version("flashinfer-python"), "python": sys.version.split()[0]}
want = {"torch": os.environ["PIN_TORCH"], "torch CUDA": os.environ["PIN_CUDA"],
        "triton": os.environ["PIN_TRITON"], "flashinfer-python": os.environ["PIN_FLASHINFER"]}
for k, v in got.items():
    print(f"   {k:18} {v:24} {'pinned ' + want[k] if k in want else ''}")
bad = [k for k in want if got[k].split("+")[0] != want[k]]
assert not bad, f"not the Dockerfile's pins: {bad}"
for pkg in ("flashinfer_jit_cache", "flashinfer_cubin"):
    print(f"   {pkg:18} {'installed' if importlib.util.find_spec(pkg) else 'absent'}")
EOF

# ---------------------------------------------------------------- the phases' shared pieces
"$PY" -c "
from radixserve.testing import write_tiny_checkpoint
write_tiny_checkpoint('qwen3', '$WORK/qwen3-hd64', head_dim=64)"

cat > "$WORK/phase.py" <<'EOF'
"""One phase: build radixserve.LLM with --attn ATTN on CUDA, report the backends, why, and tokens."""
import argparse, json, logging, os, shutil, sys, time, traceback
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--phase", required=True)
ap.add_argument("--attn", default="auto")
ap.add_argument("--ckpt", required=True)
ap.add_argument("--expect", required=True, help="PREFILL,DECODE backend classes, or 'fail'")
ap.add_argument("--no-nvcc", action="store_true", help="assert that nothing can find an nvcc")
ap.add_argument("--json", required=True)
a = ap.parse_args()

class Keep(logging.Handler):
    lines: list[str] = []
    def emit(self, record): self.lines.append(record.getMessage())

logging.basicConfig(level=logging.WARNING, format="   %(levelname)s %(name)s: %(message)s")
flog = logging.getLogger("radixserve.attention.factory")
flog.setLevel(logging.INFO)
flog.addHandler(Keep())

import torch
import triton
from radixserve.attention import factory

env = {
    "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
    "triton": triton.__version__, "nvcc_on_PATH": shutil.which("nvcc"),
    "CUDA_HOME": os.environ.get("CUDA_HOME"), "radixserve_find_nvcc": factory.find_nvcc(),
    "flashinfer_prebuilt": factory.flashinfer_prebuilt(), "flashinfer_blocker": factory.flashinfer_blocker(),
}
try:  # FlashInfer's own answer: the toolkit its JIT would build with
    import flashinfer
    from flashinfer.jit import cpp_ext
    env["flashinfer"] = flashinfer.__version__
    home = Path(cpp_ext.get_cuda_path())
    env["flashinfer_nvcc"] = str(home / "bin" / "nvcc") if (home / "bin" / "nvcc").is_file() else None
except Exception as e:  # noqa: BLE001 -- RuntimeError "Could not find nvcc" included
    env["flashinfer_nvcc"] = None
    env["flashinfer_get_cuda_path"] = f"{type(e).__name__}: {e}".splitlines()[0]
if a.no_nvcc:
    assert not (env["nvcc_on_PATH"] or env["radixserve_find_nvcc"] or env["flashinfer_nvcc"]), env

from radixserve import LLM, SamplingParams
from radixserve.attention.hybrid import HybridBackend

result = {"phase": a.phase, "attn": a.attn, "env": env}
t0 = time.perf_counter()
try:
    llm = LLM(a.ckpt, attn=a.attn, device="cuda", dtype="bfloat16", max_running_requests=8)
    engine = llm.scheduler.engine
    b = engine.attn_backend
    pre, dec = (b.prefill, b.decode) if isinstance(b, HybridBackend) else (b, b)
    result.update(prefill=type(pre).__name__, decode=type(dec).__name__,
                  cuda_graphs=engine.graph_runner is not None)
    prompts = ["The quick brown fox", "Hello, world! How are you", "A radix tree stores the prompts"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    result["tokens"] = [o.token_ids for o in outs]
    result["ok"] = all(len(t) == 16 for t in result["tokens"])
    maps = Path("/proc/self/maps").read_text().split()
    result["cuda_libs"] = sorted({p for p in maps if "/libcudart.so" in p or "/libcublas.so" in p})
except Exception as e:  # noqa: BLE001 -- the forced-FlashInfer phase is expected to end here
    traceback.print_exc(limit=3)
    result.update(ok=False, error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
result["seconds"] = round(time.perf_counter() - t0, 1)
result["why"] = Keep.lines
if a.expect == "fail":
    result["as_expected"] = not result["ok"]
else:
    result["as_expected"] = result["ok"] and f"{result.get('prefill')},{result.get('decode')}" == a.expect \
        and result["cuda_graphs"]
Path(a.json).write_text(json.dumps(result, indent=1))
print(f"== phase {a.phase}: --attn {a.attn} -> prefill {result.get('prefill')}, decode "
      f"{result.get('decode')}, CUDA graphs {result.get('cuda_graphs')}, ok {result['ok']} "
      f"({result['seconds']} s); expected {a.expect}: {'yes' if result['as_expected'] else 'NO'}")
for line in Keep.lines:
    print(f"   why: {line}")
if result.get("error"):
    print(f"   error: {result['error']}")
print(f"   nvcc: PATH {env['nvcc_on_PATH']}, radixserve {env['radixserve_find_nvcc']}, "
      f"FlashInfer {env['flashinfer_nvcc']}; CUDA libs {result.get('cuda_libs')}")
sys.exit(0 if result["as_expected"] else 1)
EOF

phase() {  # phase NAME ENV-ARGS... -- PHASE-ARGS...
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  mkdir -p "$WORK/fi-$name" "$WORK/triton"
  # a fresh FlashInfer workspace per phase (no JIT cache); one Triton cache, empty at phase A
  env "${envs[@]}" FLASHINFER_WORKSPACE_BASE="$WORK/fi-$name" TRITON_CACHE_DIR="$WORK/triton" \
    timeout 240 "$PY" "$WORK/phase.py" --phase "$name" --ckpt "$WORK/qwen3-hd64" \
    --json "$WORK/phase-$name.json" "$@"
}

# ---------------------------------------------------------------- A: as in the image, no nvcc
# PATH: every folder that holds an nvcc is replaced by a mirror of it without nvcc.
nopath=""
IFS=: read -ra dirs <<<"$PATH"
for i in "${!dirs[@]}"; do
  d=${dirs[$i]}
  [ -n "$d" ] || continue
  if [ -e "$d/nvcc" ]; then
    mirror="$WORK/path-$i"; mkdir -p "$mirror"
    for f in "$d"/*; do [ "$(basename "$f")" = nvcc ] || ln -s "$f" "$mirror/"; done
    echo "== no nvcc: PATH folder $d mirrored without nvcc"
    d=$mirror
  fi
  nopath="${nopath:+$nopath:}$d"
done
# LD_LIBRARY_PATH: no CUDA toolkit's runtime libraries, so torch loads its own wheels' (the image
# has no other copy); the driver's folders (libcuda.so.1) stay.
noldp=""
IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
for d in "${dirs[@]}"; do
  [ -n "$d" ] || continue
  if compgen -G "$d/libcudart.so*" >/dev/null && ! [ -e "$d/libcuda.so.1" ]; then
    echo "== no toolkit: LD_LIBRARY_PATH folder $d left out"; continue
  fi
  noldp="${noldp:+$noldp:}$d"
done
cuda_home=()
if [ -x /usr/local/cuda/bin/nvcc ]; then
  mkdir -p "$WORK/no-cuda-toolkit"
  cuda_home=(CUDA_HOME="$WORK/no-cuda-toolkit")
  echo "== no nvcc: /usr/local/cuda/bin/nvcc exists and FlashInfer falls back to it without"
  echo "   CUDA_HOME, so CUDA_HOME=$WORK/no-cuda-toolkit (empty): FlashInfer and radixserve read"
  echo "   CUDA_HOME first, and the image has no /usr/local/cuda at all"
fi
image_env=(-u CUDA_HOME -u CUDA_PATH PATH="$nopath" LD_LIBRARY_PATH="$noldp" "${cuda_home[@]}")

status=0
phase A "${image_env[@]}" -- --attn auto --expect TritonBackend,TritonBackend --no-nvcc || status=1
phase A2 "${image_env[@]}" -- --attn flashinfer,triton --expect fail --no-nvcc \
  || echo "== phase A2: FlashInfer forced without nvcc ran anyway (see above); not a failure of auto"

# ---------------------------------------------------------------- B: nvcc available
phase B -- --attn auto --expect FlashInferBackend,TritonBackend || status=1

"$PY" - "$WORK" "$SUMMARY" <<'EOF'
import json, sys
from pathlib import Path
work, out = Path(sys.argv[1]), Path(sys.argv[2])
phases = {p.stem.removeprefix("phase-"): json.loads(p.read_text()) for p in sorted(work.glob("phase-*.json"))}
a, b = phases.get("A", {}), phases.get("B", {})
same = a.get("tokens") is not None and a.get("tokens") == b.get("tokens")
print(f"== greedy tokens, Triton prefill (A) vs FlashInfer prefill (B): {'identical' if same else 'differ'}")
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text(json.dumps({"phases": phases, "tokens_identical_A_B": same}, indent=1))
print(f"== summary: {out}")
EOF
echo "== result: $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
