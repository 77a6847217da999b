"""What FlashInfer's kernels cannot serve, known without importing FlashInfer: asked by the
backend factory (to choose) and by the FlashInfer backend itself (to fall back)."""
from __future__ import annotations

# FlashInfer's FA2 kernels tile head_dim by 16 into at least four MMAs: a smaller head fails at its
# first prefill ("Invalid configuration ... NUM_MMA_D_QK=1", measured on the H200 with head_dim 16)
FLASHINFER_MIN_HEAD_DIM = 64


def flashinfer_head_dim_blocker(head_dim: int) -> str | None:
    """Why FlashInfer's kernels cannot serve heads of `head_dim`, or None."""
    if head_dim >= FLASHINFER_MIN_HEAD_DIM and head_dim % 16 == 0:
        return None
    return (f"FlashInfer's kernels need head_dim a multiple of 16 and at least "
            f"{FLASHINFER_MIN_HEAD_DIM}, not {head_dim}")
