"""The interpreter tier: on a machine without CUDA, the Triton kernels run on CPU tensors through
Triton's interpreter, switched on here before any kernel body is built."""
from __future__ import annotations

import pytest
import torch

from radixserve_kernels.testing import enable_cpu_interpreter

if not torch.cuda.is_available():
    enable_cpu_interpreter()


# The GPU attention kernels' exhaustive grids (dtype x page size x head layout x cache dtype): one
# representative case of each runs in `pytest -m gpu`; the rest carry `kernel_sweep` and run only
# when an -m expression names it: `pytest -m kernel_sweep`, when the kernels change (cold, each
# case compiles its own kernels, which is what makes the grid too long for the gpu tier).
SWEPT = {"test_decode_attention", "test_extend_attention", "test_decode_attention_fp8_kv",
         "test_extend_attention_fp8_kv", "test_decode_attention_rotates_and_stores_the_new_token"}
REPRESENTATIVE = {"dtype": torch.bfloat16, "page": 16, "heads": (16, 8), "dim": 128,
                  "kv_dtype": None}


def is_sweep_case(name: str, params: dict[str, object]) -> bool:
    return name in SWEPT and any(
        params[k] != v for k, v in REPRESENTATIVE.items() if k in params)


def pytest_itemcollected(item: pytest.Item) -> None:
    callspec = getattr(item, "callspec", None)
    if item.path.name == "test_kernels_gpu.py" and callspec is not None and is_sweep_case(getattr(item, "originalname", ""), callspec.params):
        item.add_marker(pytest.mark.kernel_sweep)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "kernel_sweep" in (config.option.markexpr or ""):
        return
    named = {a.split("[")[0] for a in config.args if "::" in a}  # a case asked for by name runs
    swept = [i for i in items if i.get_closest_marker("kernel_sweep")
             and i.nodeid.split("[")[0] not in named]
    if swept:
        config.hook.pytest_deselected(items=swept)
        gone = set(map(id, swept))
        items[:] = [i for i in items if id(i) not in gone]
