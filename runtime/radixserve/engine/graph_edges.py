"""CUDA graphs whose kernels launched with programmatic dependent launch (PDL) start as soon as
the kernel before them has all its blocks running, not when it ends.

A PDL kernel (`radixserve_kernels._jit.pdl`) waits in `griddepcontrol.wait` before its first load
or store, and PTX defines that wait as: until the grids it depends on have completed and their
writes are visible. Captured into a graph, a PDL launch becomes a *programmatic* edge from the
kernel before it, on that kernel's programmatic port, which fires when all its blocks have
triggered (our Triton kernels do so on entry) or exited. cuBLAS's kernels never trigger, so the
norm or activation kernel after each projection launched only once the GEMM had ended: on the
H200, 0.9 µs of idle GPU four times a layer (docs/benchmarks.md). Moving those edges to the
launch-order port (all blocks have begun) lets the launch overlap the GEMM's last blocks; the
wait still orders the memory. It recovers part of that time, not all (the wait's release still
costs): 2.971 -> 2.903 ms a batch-64 decode step, 6.15 -> 6.13 at 129-256 requests.

Needs a driver with the CUDA 12.3 edge API and a torch that keeps the captured graph
(`CUDAGraph(keep_graph=True)`); without either, graphs are captured as before."""
from __future__ import annotations

import ctypes
import functools
import logging
from typing import NamedTuple

import torch

logger = logging.getLogger(__name__)

# cudaGraphDependencyType / CUgraphDependencyType, and the kernel node's outgoing ports
DEPENDENCY_PROGRAMMATIC = 1
PORT_PROGRAMMATIC = 1
PORT_LAUNCH_ORDER = 2


class Edge(NamedTuple):
    src: int  # graph node handles
    dst: int
    from_port: int
    dep_type: int


def edges_to_move(edges: list[Edge]) -> list[int]:
    """Indices of the programmatic edges whose source was not itself launched with PDL (no
    programmatic edge into it): a kernel that never triggers its dependents, such as cuBLAS's.
    Edges out of PDL kernels keep their port (they trigger on entry already)."""
    pdl_nodes = {e.dst for e in edges if e.dep_type == DEPENDENCY_PROGRAMMATIC}
    return [i for i, e in enumerate(edges)
            if e.dep_type == DEPENDENCY_PROGRAMMATIC and e.from_port == PORT_PROGRAMMATIC
            and e.src not in pdl_nodes]


class _EdgeData(ctypes.Structure):  # CUgraphEdgeData
    _fields_ = [("from_port", ctypes.c_ubyte), ("to_port", ctypes.c_ubyte),
                ("type", ctypes.c_ubyte), ("reserved", ctypes.c_ubyte * 5)]


@functools.cache
def _driver() -> ctypes.CDLL | None:
    """libcuda with the edge-data graph API (CUDA 12.3+), or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        for name in ("cuGraphGetEdges_v2", "cuGraphAddDependencies_v2",
                     "cuGraphRemoveDependencies_v2"):
            getattr(lib, name)
    except (OSError, AttributeError) as e:
        logger.info("CUDA graph edges stay as captured: %s", e)
        return None
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def _read_edges(lib: ctypes.CDLL, graph: ctypes.c_void_p) -> tuple[list[Edge], list[_EdgeData]]:
    n = ctypes.c_size_t(0)
    _check(lib.cuGraphGetEdges_v2(graph, None, None, None, ctypes.byref(n)), "cuGraphGetEdges")
    src, dst = (ctypes.c_void_p * n.value)(), (ctypes.c_void_p * n.value)()
    data = (_EdgeData * n.value)()
    _check(lib.cuGraphGetEdges_v2(graph, src, dst, data, ctypes.byref(n)), "cuGraphGetEdges")
    edges = [Edge(src[i] or 0, dst[i] or 0, data[i].from_port, data[i].type) for i in range(n.value)]
    return edges, list(data)


def relax_edges(graph: torch.cuda.CUDAGraph) -> int:
    """Move the edges `edges_to_move` picks to the launch-order port in a captured, not yet
    instantiated graph; returns how many moved."""
    lib = _driver()
    if lib is None:
        return 0
    handle = ctypes.c_void_p(graph.raw_cuda_graph())
    edges, data = _read_edges(lib, handle)
    moves = edges_to_move(edges)
    for i in moves:
        src, dst = (ctypes.c_void_p * 1)(edges[i].src), (ctypes.c_void_p * 1)(edges[i].dst)
        one = (_EdgeData * 1)(data[i])
        count = ctypes.c_size_t(1)
        _check(lib.cuGraphRemoveDependencies_v2(handle, src, dst, one, count),
               "cuGraphRemoveDependencies")
        one[0].from_port = PORT_LAUNCH_ORDER
        _check(lib.cuGraphAddDependencies_v2(handle, src, dst, one, count), "cuGraphAddDependencies")
    return len(moves)


def _relaxable() -> bool:
    from radixserve_kernels import pdl_enabled

    return pdl_enabled() and _driver() is not None


def new_graph() -> torch.cuda.CUDAGraph:
    """A graph to capture into; pass it to `finish_capture` after the capture."""
    if _relaxable():
        try:
            return torch.cuda.CUDAGraph(keep_graph=True)
        except TypeError:  # a torch without keep_graph
            pass
    return torch.cuda.CUDAGraph()


def finish_capture(graph: torch.cuda.CUDAGraph) -> int:
    """Relax a `new_graph`'s edges and instantiate it; returns how many edges moved (0, and
    nothing done, for a graph instantiated at capture)."""
    try:
        handle = graph.raw_cuda_graph()
    except RuntimeError:  # instantiated at capture_end (keep_graph off)
        return 0
    if not handle:
        return 0
    moved = relax_edges(graph)
    graph.instantiate()
    return moved
