"""spec.runtime.hierarchicalCache: the server gets the host KV tier's flags, and the pod's memory
request (and limit, where one is set) grows by the tier, so the kubelet never kills a pod for
the memory its tier pins; a CPU replica's tier sized by ratio shares the runtime's KV budget."""

from __future__ import annotations

from typing import Any

import pytest

from radixserve_operator.reconcile import plan

GiB = 2**30


def container(make_body, fetch, spec: dict[str, Any]) -> dict[str, Any]:
    _, _, objects, _ = plan(make_body(spec), fetch)
    (c,) = objects[0]["spec"]["template"]["spec"]["containers"]
    return c


def gib(quantity: str) -> float:
    assert quantity.endswith(("Gi", "Mi")), quantity
    return int(quantity[:-2]) / (1 if quantity.endswith("Gi") else 1024)


def test_size_per_rank_grows_the_request_and_the_limit(make_body, fetch, validate_k8s) -> None:
    spec = {"model": {"source": "Qwen/Qwen3-32B"}, "parallelism": {"tensor": 2},
            "runtime": {"hierarchicalCache": {"size": "48Gi", "writePolicy": "write_back"}},
            "resources": {"limits": {"memory": "100Gi"}, "requests": {"memory": "64Gi"}}}
    c = container(make_body, fetch, spec)
    args = c["args"]
    assert "--enable-hierarchical-cache" in args
    assert args[args.index("--hicache-size") + 1] == "48.0"
    assert args[args.index("--hicache-write-policy") + 1] == "write_back"
    assert "--hicache-ratio" not in args
    assert gib(c["resources"]["requests"]["memory"]) == 64 + 2 * 48  # two ranks
    assert gib(c["resources"]["limits"]["memory"]) == 100 + 2 * 48
    _, _, objects, _ = plan(make_body(spec), fetch)
    validate_k8s(objects[0])


def test_ratio_grows_the_default_request_by_its_bound(make_body, fetch) -> None:
    base = {"gpu": {"memoryGiB": 80}, "runtime": {"memoryRatio": 0.5}}
    without = container(make_body, fetch, base)
    spec = {**base, "runtime": {"memoryRatio": 0.5, "hierarchicalCache": {"ratio": 3}}}
    c = container(make_body, fetch, spec)
    assert c["args"][c["args"].index("--hicache-ratio") + 1] == "3.0"
    grown = gib(c["resources"]["requests"]["memory"]) - gib(without["resources"]["requests"]["memory"])
    assert grown == pytest.approx(3 * 0.5 * 80)
    assert "limits" not in c["resources"] or "memory" not in c["resources"]["limits"]


def test_a_limit_alone_stays_alone(make_body, fetch) -> None:
    spec = {"gpu": {"enabled": False}, "resources": {"limits": {"memory": "8Gi"}},
            "runtime": {"hierarchicalCache": {"size": "2Gi"}}}
    res = container(make_body, fetch, spec)["resources"]
    assert gib(res["limits"]["memory"]) == 10 and "memory" not in res.get("requests", {})


def test_a_cpu_replica_tier_by_ratio_shares_the_kv_budget(make_body, fetch) -> None:
    spec = {"gpu": {"enabled": False}, "resources": {"requests": {"cpu": "1", "memory": "4Gi"}},
            "runtime": {"hierarchicalCache": {"ratio": 2}}}
    c = container(make_body, fetch, spec)
    assert "--enable-hierarchical-cache" in c["args"]
    assert c["resources"]["requests"]["memory"] == "4Gi"
