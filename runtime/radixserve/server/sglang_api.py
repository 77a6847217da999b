"""What a gateway built for SGLang workers reads from one (the SGLang model gateway `smg`,
sglang-router, the Gateway API Inference Extension's endpoint picker): `/server_info` and
`/model_info` (each also under its older `/get_` name) and the load endpoints `/get_load` and
`/v1/loads`, all under SGLang's field names. Every value comes from the serving configuration or
from the scheduler's latest periodic stats; nothing here waits on the scheduler."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fastapi import APIRouter

from radixserve.server.json_body import ParsedJsonRoute
from radixserve.server.state import ServerState, StateDep
from radixserve.version import __version__

router = APIRouter(route_class=ParsedJsonRoute)


@dataclass(frozen=True)
class ServerInfo:
    """The serving configuration under SGLang's `server_args` names, fixed once the scheduler is up."""

    model_path: str  # the model as the operator named it (hub id or path), as SGLang reports it
    served_model_name: str
    tp_size: int
    page_size: int
    context_length: int
    max_total_num_tokens: int  # KV capacity in tokens
    max_running_requests: int
    chunked_prefill_size: int | None  # tokens per prefill batch; None: the device's default
    disable_radix_cache: bool
    model_type: str | None
    architectures: list[str] | None

    @staticmethod
    def read_model_config(model_dir: str) -> tuple[str | None, list[str] | None]:
        """`model_type` and `architectures` of the checkpoint's config.json (None where absent)."""
        try:
            cfg = json.loads((Path(model_dir) / "config.json").read_text())
        except (OSError, ValueError):
            return None, None
        archs = cfg.get("architectures")
        return cfg.get("model_type"), list(archs) if isinstance(archs, list) else None


def _info(s: ServerState) -> ServerInfo:
    assert s.server_info is not None, "the server sets its ServerInfo before serving"
    return s.server_info


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(s: StateDep) -> dict:
    i = _info(s)
    fields = {k: v for k, v in asdict(i).items() if k not in ("model_type", "architectures")}
    return fields | {
        "tokenizer_path": i.model_path,
        "dp_size": 1,
        "max_total_tokens": i.max_total_num_tokens,
        "max_prefill_tokens": i.chunked_prefill_size,
        "version": __version__,
        "internal_states": [_load(s)],
    }


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(s: StateDep) -> dict:
    i = _info(s)
    return {"model_path": i.model_path, "tokenizer_path": i.model_path, "served_model_name": i.served_model_name,
            "is_generation": True, "model_type": i.model_type, "architectures": i.architectures,
            "has_image_understanding": False, "has_audio_understanding": False}


def _load(s: ServerState) -> dict:
    """One data-parallel rank's load (this server is one rank) from the scheduler's latest stats."""
    st, i = s.metrics.last_stats, _info(s)
    running, waiting = st.get("running", 0), st.get("waiting", 0)
    used, total = st.get("kv_tokens_in_use", 0), st.get("kv_tokens_total") or i.max_total_num_tokens
    hit, computed = st.get("prefix_hit_tokens", 0), st.get("prefill_tokens", 0)
    return {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_total_reqs": running + waiting, "num_used_tokens": used, "max_total_num_tokens": total,
            "token_usage": used / total if total else 0.0,
            "cache_hit_rate": hit / (hit + computed) if hit + computed else 0.0,
            "max_running_requests": i.max_running_requests}


@router.get("/get_load")
async def get_load(s: StateDep) -> list[dict]:
    """SGLang's per-rank list: requests (running + waiting), waiting, and KV tokens in use."""
    d = _load(s)
    return [{"dp_rank": 0, "num_reqs": d["num_total_reqs"], "num_waiting_reqs": d["num_waiting_reqs"],
             "num_tokens": d["num_used_tokens"]}]


@router.get("/v1/loads")
async def loads(s: StateDep) -> dict:
    return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dp_rank_count": 1,
            "loads": [_load(s)]}
