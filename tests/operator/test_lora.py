"""spec.lora: the adapters of an InferenceService reach every replica's server (--lora-paths),
hub adapters fetched by init containers into the model cache (the server then offline), pvc://
adapters on read-only mounts of their claims; the LoRA flags are the operator's; the CRD's rules
refuse what the runtime would, in its words."""

from __future__ import annotations

import re
from typing import Any

import pytest

from radixserve_operator.crd import ADAPTER_NAME
from radixserve_operator.reconcile import plan
from radixserve_operator.spec import SpecError, parse_spec

ADAPTERS = [{"name": "sql", "source": "org/sql-lora"}, {"name": "chat", "source": "pvc://ads/chat"},
            {"name": "beside", "source": "pvc://models/qwen-lora"}, {"name": "baked", "source": "/opt/ad"},
            {"name": "tone", "source": "org/tone-lora"}]


def _pod(make_body, fetch, spec: dict[str, Any]) -> dict[str, Any]:
    _, _, (workload, *_), _ = plan(make_body(spec), fetch)
    return workload["spec"]["template"]["spec"]


def test_every_adapter_reaches_the_server_where_the_pod_holds_it(make_body, fetch, validate_k8s) -> None:
    spec = {"model": {"source": "pvc://models/qwen3"}, "lora": {"adapters": ADAPTERS,
                                                                 "maxLorasPerBatch": 4}}
    _, _, (workload, *_), _ = plan(make_body(spec), fetch)
    validate_k8s(workload)
    pod = workload["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    args = server["args"]
    paths = args[args.index("--lora-paths") + 1:]
    assert paths == ["sql=org/sql-lora", "chat=/lora/ads/chat", "beside=/models/models/qwen-lora",
                     "baked=/opt/ad", "tone=org/tone-lora"]
    assert args[args.index("--max-loras-per-batch") + 1] == "4" and "--enable-lora" in args
    # the hub adapters, each by its own init container from the repo's main branch (the model's
    # revision is the model's), into the cache the server reads offline
    inits = pod["initContainers"]
    assert [(c["name"], c["args"]) for c in inits] == [
        ("lora-download-0", ["download", "org/sql-lora", "--revision", "main"]),
        ("lora-download-1", ["download", "org/tone-lora", "--revision", "main"])]
    assert all(c["volumeMounts"] == server["volumeMounts"] for c in inits)
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in server["env"]
    # the adapters' own claim read-only at /lora/CLAIM; the model's claim not mounted twice
    claims = {v["persistentVolumeClaim"]["claimName"]: v["name"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"models": "model-source", "ads": "lora-source-0"}
    mount = next(m for m in server["volumeMounts"] if m["name"] == "lora-source-0")
    assert mount == {"name": "lora-source-0", "mountPath": "/lora/ads", "readOnly": True}


def test_a_hub_model_downloads_first_then_its_adapters(make_body, fetch) -> None:
    pod = _pod(make_body, fetch, {"model": {"source": "Qwen/Qwen3-0.6B"},
                                  "lora": {"adapters": ADAPTERS[:1]}})
    assert [c["name"] for c in pod["initContainers"]] == ["model-download", "lora-download-0"]


def test_lora_on_with_no_adapter_serves_those_loaded_later(make_body, fetch) -> None:
    pod = _pod(make_body, fetch, {"lora": {}})
    args = pod["containers"][0]["args"]
    assert "--enable-lora" in args and "--lora-paths" not in args and "initContainers" not in pod


def test_no_lora_no_flag(make_body, fetch) -> None:
    assert not any("lora" in a for a in _pod(make_body, fetch, {})["containers"][0]["args"])


@pytest.mark.parametrize("flag", ["--lora-paths=a=/x", "--enable-lora", "--max-lora", "--max-loras-per"])
def test_the_lora_flags_are_the_operators(make_body, flag: str) -> None:
    with pytest.raises(SpecError, match="is the operator's"):
        parse_spec(make_body({"runtime": {"extraArgs": [flag]}}))


def test_adapter_names_are_unique(make_body) -> None:
    twice = [{"name": "sql", "source": "org/a"}, {"name": "sql", "source": "org/b"}]
    with pytest.raises(SpecError, match="spec.lora.adapters: each name once, repeated: sql"):
        parse_spec(make_body({"lora": {"adapters": twice}}))


@pytest.mark.parametrize("name", ["sql", "org/sql-v2", "A.b_c", "7b"])
def test_the_crd_names_adapters_as_the_runtime_does(name: str) -> None:
    from radixserve.config import adapter_name_fault

    assert re.match(ADAPTER_NAME, name) and adapter_name_fault(name) is None
    for bad in (f"-{name}", f"{name}:x", f"{name} x", f".{name}"):
        assert not re.match(ADAPTER_NAME, bad) and adapter_name_fault(bad) is not None, bad
