"""Vision Transformer (Dosovitskiy et al., 2021, "An Image is Worth 16x16 Words").

The baseline the course work compares the MLP models against. The image is cut into N patches
and embedded as Mixer does; a learned class token is put in front and a position embedding is
added (attention itself is blind to order):

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos          (N+1, D)
    z'_l = z_{l-1} + MSA(LN(z_{l-1}))                         pre-norm residual blocks
    z_l  = z'_l + MLP(LN(z'_l))
    y    = LN(z_L^0)                                          the class token only
    logits = y W_head + b_head                                (zero-initialised, as in the official code)

E_pos is learned (truncated normal, std 0.02) or the fixed sinusoid of "Attention Is All You
Need": PE[t, 2i] = sin(t / 10000^(2i/D)), PE[t, 2i+1] = cos(t / 10000^(2i/D)).
"""

from __future__ import annotations

import math

import numpy as np

from ..ops import concatenate
from ..backend import array_module
from ..nn import (
    LayerNorm, Linear, Module, MultiHeadSelfAttention, Parameter, PatchEmbedding, Sequential, init,
)
from .mixer import MLP, check_gelu, require_positive

__all__ = ["ViTBlock", "ViT", "sinusoidal_embedding"]


def sinusoidal_embedding(num_positions, dim):
    """The fixed (num_positions, dim) sinusoidal table, float64 NumPy (interleaved sin, cos)."""
    position = np.arange(num_positions)[:, None]
    frequency = np.exp(-math.log(10000.0) * np.arange(0, dim, 2) / dim)   # 1 / 10000^(2i/D)
    table = np.zeros((num_positions, dim))
    table[:, 0::2] = np.sin(position * frequency)
    table[:, 1::2] = np.cos(position * frequency[: dim // 2])
    return table


class ViTBlock(Module):
    """Pre-norm Transformer encoder block on tokens x of shape (B, N, D)."""

    def __init__(self, dim, heads, mlp_dim, dropout=0.0, eps=1e-6, gelu="tanh", rng=None):
        super().__init__()
        self.norm1 = LayerNorm(dim, eps=eps)
        self.attn = MultiHeadSelfAttention(dim, heads, rng=rng)
        self.norm2 = LayerNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_dim, dropout, gelu, rng=rng)

    def forward(self, x):                      # x: (B, N, D)
        x = x + self.attn(self.norm1(x))       # z' = z + MSA(LN(z))
        x = x + self.mlp(self.norm2(x))        # z  = z' + MLP(LN(z'))
        return x


class ViT(Module):
    """ViT image classifier: images (B, C_in, H, W) -> logits (B, num_classes)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, heads, mlp_dim,
                 pos_embedding="learned", dropout=0.0, eps=1e-6, gelu="tanh", seed=0):
        super().__init__()
        require_positive("ViT", num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim)
        if pos_embedding not in ("learned", "sinusoidal"):
            raise ValueError(f"ViT: pos_embedding must be 'learned' or 'sinusoidal', got {pos_embedding!r}")
        if dim % heads:
            raise ValueError(f"ViT: dim {dim} is not divisible by heads {heads}")
        self.config = dict(image_size=image_size, patch_size=patch_size, in_channels=in_channels,
                           num_classes=num_classes, dim=dim, depth=depth, heads=heads, mlp_dim=mlp_dim,
                           pos_embedding=pos_embedding, dropout=dropout, eps=eps, gelu=check_gelu(gelu), seed=seed)
        rng = np.random.default_rng(seed)
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim, rng=rng)
        num_positions = self.patch_embed.num_patches + 1
        self.cls_token = Parameter(init.zeros((1, 1, dim)))
        if pos_embedding == "learned":
            self.pos_embed = Parameter(init.trunc_normal((1, num_positions, dim), rng, std=0.02))
        else:  # a fixed table: a buffer (moves with .to(), not trained, not saved)
            self.register_buffer("pos_embed", sinusoidal_embedding(num_positions, dim)[None].astype(np.float32),
                                 persistent=False)
        self.blocks = Sequential(*[ViTBlock(dim, heads, mlp_dim, dropout, eps, gelu, rng=rng) for _ in range(depth)])
        self.norm = LayerNorm(dim, eps=eps)
        self.head = Linear(dim, num_classes, rng=rng)
        init.zeros(self.head.weight)  # zero head: initial logits 0, initial loss ln(K)
        init.zeros(self.head.bias)

    def forward(self, images):
        x = self.patch_embed(images)                                   # (B, N, D)
        batch, _, dim = x.shape
        xp = array_module(x.data)
        cls = self.cls_token + xp.zeros((batch, 1, dim), dtype=x.dtype)   # one copy per image
        x = concatenate([cls, x], axis=1)                       # (B, N+1, D)
        x = x + self.pos_embed                                         # (1, N+1, D), broadcast over B
        x = self.blocks(x)
        return self.head(self.norm(x[:, 0]))                           # LN of the class token
