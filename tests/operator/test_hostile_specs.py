"""Specs written to hurt the operator: every value the CRD's OpenAPI schema bounds is bounded in
the operator too (an older CRD, or none, may have let it through), quickly and with the field
named; whatever still escapes planning becomes an InvalidSpec status, one Warning event and a
kopf PermanentError, never an endless retry."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from tests.operator.test_crd import to_json_schema

from radixserve_operator import handlers, reconcile
from radixserve_operator.spec import SpecError, parse_spec

HERE = Path(__file__).parent
SCHEMA_INVALID = [d for d in yaml.safe_load_all((HERE / "invalid/schema.yaml").read_text()) if d]


def _only_unknown_fields(doc: dict[str, Any]) -> bool:
    """Refused by strict field validation alone: the API server prunes it, the operator ignores."""
    import jsonschema

    from radixserve_operator.crd import openapi_schema

    errors = list(jsonschema.Draft4Validator(to_json_schema(openapi_schema())).iter_errors(doc))
    return all(e.validator == "additionalProperties" for e in errors)


# A sample whose only fault is an unknown field is the API server's to prune (strict field
# validation refuses it at kubectl apply); the operator ignores such a field.
JUDGED = [d for d in SCHEMA_INVALID if not _only_unknown_fields(d)]


@pytest.mark.parametrize("doc", JUDGED, ids=lambda d: d["metadata"]["name"])
def test_the_operator_refuses_what_the_schema_refuses_and_fast(doc: dict[str, Any]) -> None:
    body = {**doc, "metadata": {"name": "llm", "namespace": "serving"}}
    started = time.process_time()
    with pytest.raises(SpecError) as refused:
        parse_spec(body)
    assert time.process_time() - started < 0.5  # "1e999999" once cost minutes of CPU
    assert str(refused.value).startswith("spec."), refused.value


def _state(cluster) -> dict[str, Any]:
    (ready,) = [c for c in cluster.resource()["status"]["conditions"] if c["type"] == "Ready"]
    return ready


HOSTILE = {
    "parameter-count-400-digits": {
        "model": {"source": "/data/m", "parameters": {
            "parameterCount": "9" * 400, "numAttentionHeads": 8, "numHiddenLayers": 2,
            "headDim": 64}},
        "parallelism": {"tensor": "auto"}, "gpu": {"memoryGiB": 80},
    },
    "parameter-count-integer-overflow": {
        "model": {"source": "/data/m", "parameters": {
            "parameterCount": 10**400, "numAttentionHeads": 8, "numHiddenLayers": 2,
            "headDim": 64}},
        "parallelism": {"tensor": "auto"}, "gpu": {"memoryGiB": 80},
    },
    "shm-decimal-overflow": {"shmSize": "1e1000000"},
    # within the CRD's grammar (two exponent digits), beyond the operator's bound (an exbibyte)
    "cpu-limit-1e50": {"template": {"spec": {"container": {"resources": {"limits": {
        "cpu": "1e50"}}}}}},
    "memory-request-99Ei": {"resources": {"requests": {"memory": "99Ei"}}},
    "shm-slow-exponent": {"shmSize": "1e999999"},
    "gpu-memory-infinite": {"gpu": {"memoryGiB": float("inf")}, "parallelism": {"tensor": "auto"}},
    "gpu-memory-nan": {"gpu": {"memoryGiB": float("nan")}, "parallelism": {"tensor": "auto"}},
}  # fmt: skip


@pytest.mark.parametrize("spec", HOSTILE.values(), ids=list(HOSTILE))
def test_hostile_spec_is_a_permanent_error_with_status_and_event(cluster, memo, make_body,
                                                                 spec: dict[str, Any]) -> None:
    started = time.process_time()
    with pytest.raises(kopf.PermanentError, match="InvalidSpec"):
        handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert time.process_time() - started < 2
    assert cluster.applied == []
    ready = _state(cluster)
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert ready["message"].startswith("spec.")
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", "InvalidSpec")]
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)  # the resync: no news
    assert len(cluster.events) == 1 and cluster.applied == []


def test_an_unforeseen_error_in_planning_is_permanent_not_retried(cluster, memo, make_body,
                                                                   monkeypatch) -> None:
    def explode(*_: Any, **__: Any) -> Any:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(reconcile, "build_all", explode)
    with pytest.raises(kopf.PermanentError, match="OverflowError"):
        handlers.on_create(body=cluster.create(make_body({})), memo=memo, logger=None)
    ready = _state(cluster)
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "cannot plan this spec (OverflowError" in ready["message"]
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", "InvalidSpec")]
    assert cluster.applied == []


def _serve_parser() -> argparse.ArgumentParser:
    from radixserve.cli import serve as serve_cli

    parser = argparse.ArgumentParser(prog="radixserve", exit_on_error=False)
    serve_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


# Each moves what the operator set (the runtime's parser takes the last, and expands a prefix).
OWNED = {
    "--port": (["--port", "9000"], "port", 9000),
    "--ho": (["--ho", "127.0.0.1"], "host", "127.0.0.1"),
    "--tp=": (["--tp=8"], "tp", 8),
    "--tp-size": (["--tp-size", "8"], "tp", 8),
    "--device": (["--device", "cuda"], "device", "cuda"),
    "--model": (["--model", "/etc"], "model", "/etc"),
}


@pytest.mark.parametrize("case", OWNED, ids=str)
def test_extra_args_may_not_reset_the_operators_flags(make_body, case: str) -> None:
    extra, dest, value = OWNED[case]
    parsed = _serve_parser().parse_args(["serve", "--tp", "1", "--port", "8000", *extra])
    assert getattr(parsed, dest) == value  # what the flag would do in the pod
    with pytest.raises(SpecError, match=r"spec.runtime.extraArgs\[0\]: .* is the operator's"):
        parse_spec(make_body({"runtime": {"extraArgs": extra}}))


@pytest.mark.parametrize("extra", [["-h"], ["--help"], ["--version"]], ids=str)
def test_extra_args_may_not_make_the_server_exit(make_body, extra: list[str]) -> None:
    with pytest.raises(SpecError, match=r"spec.runtime.extraArgs\[0\]"):
        parse_spec(make_body({"runtime": {"extraArgs": extra}}))


def test_other_extra_args_pass(make_body) -> None:
    extra = ["--max-prefill-length", "4096", "--model-preset", "x", "--disable-overlap"]
    assert parse_spec(make_body({"runtime": {"extraArgs": extra}})).runtime.extra_args == tuple(extra)


@pytest.mark.parametrize(
    "field, spec",
    [
        ("spec.model.servedName", {"model": {"servedName": "--api-key"}}),
        ("spec.model.revision", {"model": {"source": "Qwen/Qwen3-0.6B", "revision": "-x"}}),
        ("spec.model.source", {"model": {"source": "--help"}}),
        ("spec.image", {"image": "--entrypoint=/bin/sh"}),
    ],
)
def test_a_value_that_becomes_an_argument_is_never_a_flag(make_body, field: str, spec) -> None:
    with pytest.raises(SpecError, match=rf"^{field.replace('.', r'[.]')}: "):
        parse_spec(make_body(spec))


def test_bounds_hold_at_their_limits(make_body, fetch, validate_k8s) -> None:
    """The caps refuse absurd values, not large real ones."""
    from radixserve_operator.reconcile import plan

    spec = {
        "replicas": 1000,
        "shmSize": "64Gi",
        "model": {"servedName": "org/Model-v1.5:fp8", "revision": "refs/pr/12"},
        "runtime": {"contextLength": 2**24, "maxRunningRequests": 2**16},
        "autoscaling": {"maxReplicas": 1000, "metric": "tokens", "target": 10**6},
        "rollout": {"maxSurge": "100%", "maxUnavailable": 0},
        "resources": {"requests": {"cpu": "96", "memory": "1.5Ti"}},
    }
    _, _, objects, _ = plan(make_body(spec), fetch)
    for obj in objects:
        if obj["apiVersion"] != "keda.sh/v1alpha1":
            validate_k8s(obj)


def test_an_api_server_failure_while_applying_is_a_status_an_event_and_a_retry(
    cluster, memo, make_body, monkeypatch
) -> None:
    def forbidden(obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        raise PermissionError(f"{obj['kind']}: forbidden")

    monkeypatch.setattr(cluster, "apply", forbidden)
    with pytest.raises(kopf.TemporaryError, match="applying failed"):
        handlers.on_create(body=cluster.create(make_body({})), memo=memo, logger=None)
    ready = _state(cluster)
    assert (ready["status"], ready["reason"]) == ("False", "ApplyFailed")
    assert "PermissionError: Deployment: forbidden" in ready["message"]
    assert [(t, r) for t, r, _ in cluster.events] == [("Warning", "ApplyFailed")]


def test_what_the_api_server_refuses_is_found_before_anything_is_written(
    cluster, memo, make_body
) -> None:
    """A NetworkPolicy peer (free-form, the API server's to judge) written after the Deployment
    and Service: its refusal in the dry run leaves the cluster as it was."""
    cluster.refused_kinds = {"NetworkPolicy"}
    spec = {"gpu": {"enabled": False}, "networkPolicy": {"ingressFrom": [{"ipBlock": {"cidr": "x"}}]}}
    with pytest.raises(kopf.PermanentError, match="NetworkPolicy llm rejected"):
        handlers.on_create(body=cluster.create(make_body(spec)), memo=memo, logger=None)
    assert cluster.applied == []
    assert [o["kind"] for o in cluster.dry_runs][:2] == ["Deployment", "Service"]
    assert _state(cluster)["reason"] == "InvalidSpec"


def test_each_generation_is_dry_run_once(cluster, memo, make_body) -> None:
    handlers.on_create(body=cluster.create(make_body({"gpu": {"enabled": False}})), memo=memo,
                       logger=None)
    once = len(cluster.dry_runs)
    assert once >= 2
    handlers.resync(body=cluster.resource(), memo=memo, logger=None)
    assert len(cluster.dry_runs) == once  # the resync re-applies, without a second dry run
