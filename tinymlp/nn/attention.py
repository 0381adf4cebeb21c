"""Self-attention layers: aMLP's single-head tiny attention and ViT's multi-head attention.

Both compute q, k, v with one Linear (one matmul for all three), call the fused attention
(softmax(q k^T / sqrt(d)) v with its own hand-derived backward: ``F.self_attention`` on the
packed [q | k | v] for the single head, ``F.attention`` once the heads are a batch axis for
ViT) and project the result with a second Linear.
"""

from __future__ import annotations

from .. import functional as F
from ..backend import array_module
from ..tensor import Tensor
from ..ops import reshape, split, transpose
from . import init
from .layers import Linear
from .module import Module

__all__ = ["MultiHeadSelfAttention", "TinyAttention"]


class TinyAttention(Module):
    """Single-head self-attention of aMLP: (B, S, dim_in) -> (B, S, dim_out).

    [q | k | v] = x Wqkv (``.qkv``: dim_in -> 3 * attn_dim, no bias, one matrix product);
    out = softmax(q k^T / sqrt(attn_dim)) v (``F.self_attention``, which takes the three thirds
    of that output whole), projected by ``.out`` (attn_dim -> dim_out).
    ``mask`` (B, S) marks the real tokens (True) of padded sequences: padding is never attended
    to. A 3-D boolean mask (B, S, S) of allowed (query, key) pairs is taken as it is.
    """

    def __init__(self, dim_in: int, dim_out: int, attn_dim: int = 64, rng=None):
        super().__init__()
        rng = init.as_rng(rng)
        self.attn_dim = int(attn_dim)
        self.qkv = Linear(dim_in, 3 * self.attn_dim, bias=False, rng=rng)
        self.out = Linear(self.attn_dim, dim_out, rng=rng)

    def forward(self, x, mask=None, causal: bool = False):
        qkv = self.qkv(x)                                          # [q | k | v]   (B, S, 3 attn_dim)
        a = F.self_attention(qkv, mask=key_mask(mask, x), causal=causal)   # softmax(q k^T / sqrt(d)) v
        return self.out(a)                                         # (B, S, dim_out)

    def extra_repr(self):
        return f"attn_dim={self.attn_dim}"


def key_mask(mask, x):
    """A 2-D (B, S) mask of real tokens as the (B, 1, S) mask of allowed keys; 3-D unchanged."""
    if mask is None:
        return None
    data = array_module(x.data).asarray(mask.data if isinstance(mask, Tensor) else mask)
    if data.ndim == 2:
        if data.shape != tuple(x.shape[:2]):
            raise ValueError(f"TinyAttention: a 2-D mask marks the real tokens, shape (B, S) = "
                             f"{tuple(x.shape[:2])}; got {tuple(data.shape)}")
        return data[:, None, :]
    return data


class MultiHeadSelfAttention(Module):
    """Multi-head self-attention (ViT): (B, S, dim) -> (B, S, dim) with ``heads`` heads of
    width d = dim / heads.

    ``.qkv`` (dim -> 3 * dim) gives per token [q | k | v], each the concatenation of the heads;
    the heads become a batch axis, (B, h, S, d), so one ``F.attention`` call serves them all;
    their outputs are concatenated back to (B, S, dim) and projected by ``.out``.
    """

    def __init__(self, dim: int, heads: int, rng=None):
        super().__init__()
        if dim % heads:
            raise ValueError(f"MultiHeadSelfAttention: dim={dim} is not divisible by heads={heads}")
        rng = init.as_rng(rng)
        self.dim, self.heads, self.head_dim = int(dim), int(heads), int(dim) // int(heads)
        self.qkv = Linear(dim, 3 * dim, rng=rng)
        self.out = Linear(dim, dim, rng=rng)

    def forward(self, x, mask=None, causal: bool = False):
        if x.ndim != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"MultiHeadSelfAttention(dim={self.dim}): expected x of shape (B, S, {self.dim}), "
                             f"got {tuple(x.shape)}")
        B, S, _ = x.shape
        h, d = self.heads, self.head_dim
        qkv = reshape(self.qkv(x), (B, S, 3, h, d))
        qkv = transpose(qkv, (2, 0, 3, 1, 4))                        # (3, B, h, S, d)
        q, k, v = (reshape(t, (B, h, S, d)) for t in split(qkv, 3, axis=0))
        a = F.attention(q, k, v, mask=mask, causal=causal)          # (B, h, S, d)
        a = reshape(transpose(a, (0, 2, 1, 3)), (B, S, self.dim))   # heads side by side again
        return self.out(a)

    def extra_repr(self):
        return f"dim={self.dim}, heads={self.heads}"
