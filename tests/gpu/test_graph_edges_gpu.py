"""A captured graph whose GEMM -> PDL-kernel edges `graph_edges` moved to the launch-order port
still computes what eager computes: the norm kernel launches while the GEMM's last blocks run, and
its `griddepcontrol.wait` must still hold it until the GEMM's output is written. The GEMM is large
(milliseconds), so a norm reading early would read a stale or half-written product."""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


def _need_relaxable() -> None:
    from radixserve.engine.graph_edges import _relaxable

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("PDL needs Hopper or later")
    if not _relaxable():
        pytest.skip("the driver lacks the CUDA 12.3 graph edge API")


def test_relaxed_gemm_to_norm_edges_keep_the_norm_waiting_for_the_product() -> None:
    from radixserve.engine.graph_edges import finish_capture, new_graph
    from radixserve_kernels import rms_norm, rms_norm_ref

    _need_relaxable()
    torch.manual_seed(0)
    x = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
    gamma = torch.rand(8192, device="cuda", dtype=torch.bfloat16) + 0.5
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # JIT outside the capture
        rms_norm(x @ w, gamma, 1e-6)
    stream.synchronize()

    graph = new_graph()
    with torch.cuda.graph(graph, stream=stream):
        out = rms_norm(torch.relu(x @ w) @ w, gamma, 1e-6)
    moved = finish_capture(graph)
    assert moved >= 1, "no GEMM -> norm edge was captured as programmatic"

    for seed in range(5):
        x.copy_(torch.randn(x.shape, generator=torch.Generator("cuda").manual_seed(seed),
                            device="cuda", dtype=x.dtype))
        graph.replay()
        want = rms_norm_ref(torch.relu(x @ w) @ w, gamma, 1e-6)
        torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
