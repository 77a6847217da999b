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


def test_least_privilege_flags_become_settings(monkeypatch) -> None:
    from radixserve_operator.__main__ import export_settings
    from radixserve_operator.settings import OperatorSettings

    for name in ("POD_SECURITY_LEVEL", "ALLOWED_SERVICE_ACCOUNTS", "ALLOWED_SECRETS",
                 "ALLOWED_REGISTRIES", "NETWORK_POLICY", "MONITORING_NAMESPACE"):  # fmt: skip
        monkeypatch.setenv(f"RADIXSERVE_{name}", "")  # restored after the test
    export_settings(
        parse_args(
            ["--pod-security-level", "restricted", "--allowed-service-accounts", "llm",
             "--allowed-secrets", "a,b", "--network-policy", "false", "--monitoring-namespace", "",
             "--allowed-registries", "registry.example.com/ml,ghcr.io/radixserve/"]
        )
    )  # fmt: skip
    s = OperatorSettings.from_env()
    assert (s.pod_security_level, s.allowed_service_accounts, s.allowed_secrets) == (
        "restricted",
        ("llm",),
        ("a", "b"),
    )
    assert s.network_policy is False and s.monitoring_namespace == ""
    assert s.allowed_registries == ("registry.example.com/ml", "ghcr.io/radixserve/")
    with pytest.raises(SystemExit):
        parse_args(["--pod-security-level", "privileged"])


def test_a_bad_setting_stops_the_operator_before_it_starts(monkeypatch, capsys) -> None:
    from radixserve_operator.__main__ import main

    monkeypatch.setenv("RADIXSERVE_POD_SECURITY_LEVEL", "privileged")
    assert main(["--liveness-port", "0"]) == 2
    assert "baseline, restricted" in capsys.readouterr().err
