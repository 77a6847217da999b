"""A CPU pod's KV cache fits under the container's memory limit: the headroom read from cgroup v1
and v2 files, and the KV budget capped to half of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.kvcache import sizing as kv_sizing
from radixserve.utils.cgroup_memory import headroom_bytes

GIB = 2**30


def _files(d: Path, **values: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, value in values.items():
        (d / name.replace("_", ".", 1)).write_text(value + "\n")


def test_v2_limit_minus_usage(tmp_path: Path) -> None:
    _files(tmp_path, memory_max=str(4 * GIB), memory_current=str(3 * GIB))
    assert headroom_bytes(tmp_path, tmp_path / "none") == GIB


def test_v1_limit_minus_usage(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(str(4 * GIB))
    (tmp_path / "memory" / "memory.usage_in_bytes").write_text(str(GIB))
    assert headroom_bytes(tmp_path, tmp_path / "none") == 3 * GIB


def test_no_limit_is_none(tmp_path: Path) -> None:
    _files(tmp_path, memory_max="max", memory_current=str(GIB))
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (tmp_path / "memory" / "memory.usage_in_bytes").write_text(str(GIB))
    assert headroom_bytes(tmp_path, tmp_path / "none") is None


def test_the_path_proc_self_cgroup_names_is_read(tmp_path: Path) -> None:
    (tmp_path / "memory" / "kubepods" / "pod1").mkdir(parents=True)
    d = tmp_path / "memory" / "kubepods" / "pod1"
    (d / "memory.limit_in_bytes").write_text(str(2 * GIB))
    (d / "memory.usage_in_bytes").write_text(str(GIB))
    proc = tmp_path / "cgroup"
    proc.write_text("5:memory:/kubepods/pod1\n4:cpu,cpuacct:/kubepods/pod1\n")
    assert headroom_bytes(tmp_path, proc) == GIB


def test_cpu_kv_budget_is_capped_by_the_container_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXSERVE_CPU_KV_GIB", "2")
    monkeypatch.setattr(kv_sizing, "headroom_bytes", lambda: GIB)  # 1 GiB left in the container
    tokens = kv_sizing.kv_token_capacity(torch.device("cpu"), 1024, 0.9, 10**9)
    assert tokens * 1024 == GIB // 2
    monkeypatch.setattr(kv_sizing, "headroom_bytes", lambda: None)  # no limit: the setting
    assert kv_sizing.kv_token_capacity(torch.device("cpu"), 1024, 0.9, 10**9) * 1024 == 2 * GIB
