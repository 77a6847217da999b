"""`radixserve-operator` flags -> kopf.run options (scope, liveness, peering, priority)."""

from __future__ import annotations

import pytest

from radixserve_operator.__main__ import default_priority, kopf_options, parse_args


def test_defaults_watch_the_cluster_standalone_with_liveness(monkeypatch) -> None:
    monkeypatch.delenv("RADIXSERVE_OPERATOR_PRIORITY", raising=False)
    opts = kopf_options(parse_args([]))
    assert opts["clusterwide"] is True and "namespaces" not in opts
    assert opts["standalone"] is True and opts["peering_name"] is None
    assert opts["liveness_endpoint"] == "http://0.0.0.0:8080/healthz"


def test_namespaces_peering_and_port() -> None:
    opts = kopf_options(
        parse_args(
            [
                "--namespace",
                "a",
                "-n",
                "b",
                "--liveness-port",
                "9090",
                "--peering",
                "radixserve",
                "--priority",
                "7",
            ]
        )
    )
    assert opts["namespaces"] == ["a", "b"] and "clusterwide" not in opts
    assert (opts["standalone"], opts["peering_name"], opts["priority"]) == (False, "radixserve", 7)
    assert opts["liveness_endpoint"] == "http://0.0.0.0:9090/healthz"
    assert kopf_options(parse_args(["--liveness-port", "0"]))["liveness_endpoint"] is None


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--namespace", "a", "--all-namespaces"])


def test_replicas_get_distinct_priorities(monkeypatch) -> None:
    monkeypatch.delenv("RADIXSERVE_OPERATOR_PRIORITY", raising=False)
    seen = set()
    for pod in ("radixserve-operator-7c9d-abcde", "radixserve-operator-7c9d-fghij"):
        monkeypatch.setattr("socket.gethostname", lambda pod=pod: pod)
        seen.add(default_priority())
    assert len(seen) == 2
    monkeypatch.setenv("RADIXSERVE_OPERATOR_PRIORITY", "42")
    assert parse_args([]).priority == 42
