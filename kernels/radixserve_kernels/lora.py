"""Many LoRA adapters in one batch: the low-rank update `y += (x @ A.T) @ B.T` of each token by
the adapter of its request, as two grouped GEMMs (SGMV-style, one launch each whatever the
number of adapters): `lora_shrink` (x [T, in] into the rank space, v [T, P*R], left as its
K splits' partial planes) and `lora_expand_` (v back onto the layer's output y [T, out], in
place, summing the planes as it loads them).

The weights of every adapter slot live in one stack per layer: `a` [S, P*R, in] holds each of
the layer's P fused projections' A (q, k, v of a fused qkv; gate, up of gate-up; P = 1
otherwise) in its own R rows, R the pool's largest rank; `b` [S, out, R] holds each projection's
B in its own output rows (`part_bounds`), its scaling folded in. An adapter of a smaller rank, or
one that leaves a projection out, has zeros there.

Tokens are grouped by slot once a forward (`lora_groups`, on the device, no host sync, so a CUDA
graph captures it): a program takes one tile (up to 16 tokens of one slot, found by a scan of
the slots' counts), and the grid allows for the most tiles the batch's size can make, so the
programs past the tiles a batch has return at once (not one per slot and block: at batch 1 with
8 slots that would launch 8 times the programs); the base model's tokens (slot -1) belong to no
group and keep the layer's output as it is.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from radixserve_kernels._utils import cdiv, dot_precision, next_pow2, pdl_args

# the shrink cuts its K (the layer's input) into splits of at least this many columns, as many
# as it takes to give the device about SHRINK_PROGRAMS programs: the rank is small, so a
# decode step's few tokens would otherwise leave a handful of programs each streaming its whole
# A, a latency-bound chain of loads. The splits' partial planes (float32) are summed by the
# expand as it loads them, so a split costs no launch.
SHRINK_SPLIT_MIN_COLS = 256
SHRINK_PROGRAMS = 128
SHRINK_BLOCK_M = 16


class LoRAGroups(NamedTuple):
    """The tokens of a batch grouped by adapter slot. `slots` [T] int32 (-1: the base model);
    `order` [T] int32, the token indices sorted by slot (base tokens last); `starts` and `counts`
    [S] int32: where slot s's tokens begin in `order`, and how many there are."""

    slots: torch.Tensor
    order: torch.Tensor
    starts: torch.Tensor
    counts: torch.Tensor


def lora_groups(slots: torch.Tensor, num_slots: int) -> LoRAGroups:
    """Group tokens by slot, on the device without a host sync (capturable)."""
    key = torch.where(slots < 0, num_slots, slots).long()
    # NOTE: not torch.bincount, which reads the values' range on the host under CUDA
    counts = torch.zeros(num_slots + 1, dtype=torch.int64, device=slots.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    starts = torch.cumsum(counts, 0) - counts
    order = torch.argsort(key, stable=True)
    return LoRAGroups(slots.to(torch.int32), order.to(torch.int32),
                      starts[:num_slots].to(torch.int32), counts[:num_slots].to(torch.int32))


def _slot_rows(groups: LoRAGroups) -> list[tuple[int, torch.Tensor]]:
    """(slot, its token indices) for each slot present (reads the slots on the host)."""
    slots = groups.slots.long()
    return [(s, torch.nonzero(slots == s).flatten()) for s in torch.unique(slots).tolist() if s >= 0]


def lora_shrink_ref(x: torch.Tensor, a: torch.Tensor, groups: LoRAGroups,
                    gated: bool = False) -> torch.Tensor:
    """v [T, P*R] = x @ a[slot].T per token (x's dtype); zero rows for the base model's tokens.
    `gated`: x is [gate | up] and the input silu(gate) * up (a gated MLP's down projection)."""
    if gated:
        from radixserve_kernels.activation import silu_and_mul_ref

        x = silu_and_mul_ref(x)
    v = torch.zeros(x.shape[0], a.shape[1], dtype=x.dtype, device=x.device)
    for s, rows in _slot_rows(groups):
        v[rows] = x[rows] @ a[s].T
    return v


def lora_expand_ref(y: torch.Tensor, v: torch.Tensor, b: torch.Tensor, groups: LoRAGroups,
                    part_bounds: tuple[int, ...]) -> torch.Tensor:
    """y[:, lo_p:hi_p] += v[:, p*R:(p+1)*R] @ b[slot, lo_p:hi_p].T per token and projection p
    (`part_bounds` = lo_0, hi_0 = lo_1, ..., hi_P-1), in place; returns y."""
    rank = b.shape[2]
    for s, rows in _slot_rows(groups):
        for p, (lo, hi) in enumerate(itertools.pairwise(part_bounds)):
            delta = v[rows, p * rank:(p + 1) * rank] @ b[s, lo:hi].T
            y[rows, lo:hi] += delta
    return y


def max_tiles(tokens: int, num_slots: int, block_m: int) -> int:
    """The most tiles of `block_m` tokens of one slot that `tokens` tokens can make: each slot
    with tokens starts a tile (known on the device only: the grid allows for the worst case)."""
    return cdiv(tokens, block_m) + min(num_slots, tokens) - 1


def shrink_splits(tokens: int, k: int, n_blocks: int) -> int:
    """How many splits of K the shrink of `tokens` tokens takes (1: no partial planes)."""
    m_blocks = cdiv(max(tokens, 1), SHRINK_BLOCK_M)
    return max(1, min(k // SHRINK_SPLIT_MIN_COLS, cdiv(SHRINK_PROGRAMS, m_blocks * n_blocks)))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, groups: LoRAGroups,
                gated: bool = False) -> torch.Tensor:
    """Triton twin of `lora_shrink_ref` for x [T, in] ([T, 2 * in] gated; last dim contiguous),
    a [S, P*R, in] contiguous, left as its splits' partial planes [splits, T, P*R] (x's dtype
    where there is one, float32 where there are several; `lora_expand_` and `lora_gemv` sum them
    as they read them). The rows of base-model tokens are left unwritten (nothing reads them)."""
    from radixserve_kernels._jit.lora import lora_gemm_kernel

    t, k = x.shape[0], a.shape[2]
    num_slots, n, _ = a.shape
    if x.shape[1] != (2 * k if gated else k):
        raise ValueError(f"lora_shrink of an A of {k} columns takes x [T, {2 * k if gated else k}]"
                         f"{' (gated)' if gated else ''}, got {list(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_n = min(64, max(16, next_pow2(n)))
    splits = shrink_splits(t, k, cdiv(n, block_n))
    out_dtype = x.dtype if splits == 1 else torch.float32
    out = torch.empty(splits, t, n, dtype=out_dtype, device=x.device)
    if t > 0:
        block_k = 128 if x.dtype != torch.float32 else 64
        k_split = cdiv(cdiv(k, splits), block_k) * block_k
        grid = (max_tiles(t, num_slots, SHRINK_BLOCK_M), cdiv(n, block_n) * splits)
        lora_gemm_kernel[grid](
            x, a, out, groups.order, groups.starts, groups.counts, num_slots,
            n, k, k_split, x.stride(0), 0, a.stride(0), a.stride(1), out.stride(1),
            out.stride(0), n, n, 0,
            SPLITS=splits, IN_PLANES=1, NUM_PARTS=1, ACCUMULATE=False, GATED=gated,
            BLOCK_M=SHRINK_BLOCK_M, BLOCK_N=block_n, BLOCK_K=block_k,
            PRECISION=dot_precision(x.dtype), num_warps=4, num_stages=2, **pdl_args(x),
        )
    return out


def _part_ends(part_bounds: tuple[int, ...], n: int) -> tuple[int, int]:
    """Where projections 0 and 1 of an output of `n` columns end (at most 3 projections; an
    absent one ends at n)."""
    parts = len(part_bounds) - 1
    assert 1 <= parts <= 3 and part_bounds[0] == 0 and part_bounds[-1] == n, part_bounds
    ends = list(part_bounds[1:-1]) + [n] * (3 - parts)
    return ends[0], ends[1]


def lora_expand_(y: torch.Tensor, v: torch.Tensor, b: torch.Tensor, groups: LoRAGroups,
                 part_bounds: tuple[int, ...]) -> torch.Tensor:
    """Triton twin of `lora_expand_ref`: y [T, out] (rows may be strided, last dim contiguous)
    updated in place, v [T, P*R] or the shrink's unreduced planes [splits, T, P*R], b [S, out, R]
    contiguous; at most 3 projections."""
    from radixserve_kernels._jit.lora import lora_gemm_kernel

    t, n = y.shape
    num_slots, _, rank = b.shape
    parts = len(part_bounds) - 1
    ends = _part_ends(part_bounds, n)
    planes = v if v.dim() == 3 else v.unsqueeze(0)
    assert y.stride(-1) == 1 and planes.stride(-1) == 1, "y and v need contiguous rows"
    if t == 0:
        return y
    block_m, block_n, block_k = 16, 64, 16
    grid = (max_tiles(t, num_slots, block_m), cdiv(n, block_n))
    lora_gemm_kernel[grid](
        planes, b, y, groups.order, groups.starts, groups.counts, num_slots,
        n, rank, rank, planes.stride(1), planes.stride(0), b.stride(0), b.stride(1), y.stride(0),
        0, ends[0], ends[1], rank,
        SPLITS=1, IN_PLANES=planes.shape[0], NUM_PARTS=parts, ACCUMULATE=True, GATED=False,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=dot_precision(y.dtype),
        num_warps=4, num_stages=2, **pdl_args(y),
    )
    return y


def lora_gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  a: torch.Tensor, b: torch.Tensor, groups: LoRAGroups,
                  part_bounds: tuple[int, ...], gated: bool = False) -> torch.Tensor:
    """A layer's product for x plus each token's adapter update: `F.linear` (of silu(gate) * up
    where `gated`), then `lora_shrink_ref` and `lora_expand_ref`."""
    from radixserve_kernels.activation import silu_and_mul_ref

    y = F.linear(silu_and_mul_ref(x) if gated else x, weight, bias)
    return lora_expand_ref(y, lora_shrink_ref(x, a, groups, gated), b, groups, part_bounds)


def lora_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              a: torch.Tensor, b: torch.Tensor, groups: LoRAGroups, part_bounds: tuple[int, ...],
              gated: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton twin of `lora_gemv_ref` for one row x [1, in] ([1, 2 * in] gated), a 16-bit weight
    [N, in] contiguous (decode at batch 1): the shrink, then the one-row GEMV with the expand in
    its epilogue, two launches where the unfused layer takes three (four gated: the activation
    too). `out`: a [1, N] buffer the row is written to (contiguous)."""
    from radixserve_kernels.gemv import GemvLoRA, _gemv

    n = weight.shape[0]
    if x.dim() != 2 or x.shape[0] != 1:
        raise ValueError(f"lora_gemv takes one row, got x {list(x.shape)}")
    ends = _part_ends(part_bounds, n)
    if x.stride(-1) != 1:
        x = x.contiguous()
    assert weight.is_contiguous() and b.is_contiguous(), "the weights must be contiguous"
    planes = lora_shrink(x, a, groups, gated)
    y = out if out is not None else torch.empty(1, n, dtype=x.dtype, device=x.device)
    return _gemv(x, weight, bias, y, gated, GemvLoRA(planes, b, groups.slots, ends))
