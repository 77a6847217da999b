"""Which captured graph edges `graph_edges` moves to the launch-order port: only programmatic
edges out of kernels that were not launched with PDL themselves (cuBLAS's GEMMs, which never
trigger their dependents). The move itself runs on the GPU tier: tests/gpu/test_graph_edges_gpu.py
checks a moved edge still orders the memory, and every graph test captures through it."""
from __future__ import annotations

from radixserve.engine.graph_edges import (
    DEPENDENCY_PROGRAMMATIC,
    PORT_LAUNCH_ORDER,
    PORT_PROGRAMMATIC,
    Edge,
    edges_to_move,
)

FULL = 0  # a default (full) dependency on the default port


def test_only_edges_out_of_non_pdl_kernels_into_pdl_kernels_move() -> None:
    # copy(1) -> gemm(2) -PDL-> norm(3) -PDL-> rope(4) -> gemm(5) -PDL-> silu(6); 6 -> memcpy(7)
    edges = [
        Edge(1, 2, 0, FULL),
        Edge(2, 3, PORT_PROGRAMMATIC, DEPENDENCY_PROGRAMMATIC),  # GEMM -> PDL kernel: moves
        Edge(3, 4, PORT_PROGRAMMATIC, DEPENDENCY_PROGRAMMATIC),  # PDL -> PDL: stays
        Edge(4, 5, 0, FULL),
        Edge(5, 6, PORT_PROGRAMMATIC, DEPENDENCY_PROGRAMMATIC),  # GEMM -> PDL kernel: moves
        Edge(6, 7, 0, FULL),
    ]
    assert edges_to_move(edges) == [1, 4]


def test_edges_already_on_another_port_and_full_edges_stay() -> None:
    edges = [
        Edge(1, 2, PORT_LAUNCH_ORDER, DEPENDENCY_PROGRAMMATIC),
        Edge(1, 3, 0, FULL),
        Edge(3, 4, 0, FULL),
    ]
    assert edges_to_move(edges) == []
    assert edges_to_move([]) == []
