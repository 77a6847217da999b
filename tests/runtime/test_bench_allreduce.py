"""`radixserve bench allreduce` refuses clearly, before spawning anything, where it cannot run."""
from __future__ import annotations

import pytest
import torch

from radixserve.cli import main

ENOUGH_GPUS = torch.cuda.device_count() >= 2


@pytest.mark.skipif(ENOUGH_GPUS, reason="this host has the GPUs: the bench would run")
def test_refuses_without_enough_cuda_devices() -> None:
    with pytest.raises(SystemExit, match=r"--tp 2 needs >= 2 CUDA devices \(NCCL\), found \d"):
        main(["bench", "allreduce", "--tp", "2", "--batch-sizes", "1"])


@pytest.mark.parametrize("argv,field", [
    (["--tp", "1"], "tp must be at least 2"),
    (["--batch-sizes", "8", "0"], "batch_sizes must be positive"),
    (["--layers", "0"], "layers must be positive"),
])
def test_rejects_bad_arguments_naming_the_field(argv, field) -> None:
    with pytest.raises(SystemExit, match=f"bench allreduce: {field}"):
        main(["bench", "allreduce", *argv])


def test_rejects_an_unknown_implementation() -> None:
    with pytest.raises(SystemExit, match="bench allreduce: impls must be among nccl, one_shot"):
        main(["bench", "allreduce", "--impl", "fastest"])


@pytest.mark.parametrize("sub", ["offline", "latency"])
def test_allreduce_modes_need_tp_and_valid_names(sub) -> None:
    with pytest.raises(SystemExit, match="--allreduce needs --tp 2"):
        main(["bench", sub, "--allreduce", "nccl"])
    with pytest.raises(SystemExit, match="--allreduce takes auto, nccl, one_shot, two_shot, got fast"):
        main(["bench", sub, "--tp", "2", "--allreduce", "fast"])
