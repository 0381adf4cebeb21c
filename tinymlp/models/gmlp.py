"""gMLP and aMLP (Liu, Dai, So, Le, 2021, "Pay Attention to MLPs").

Tokens X (S x C) go through L identical blocks. Each block widens the channels, lets the
tokens talk to each other through a spatial gating unit (SGU), and narrows back:

    X^ = LN(X)
    Z  = GELU(X^ U + b_U)                     (S, d_ffn)      channel projection in
    Z~ = s(Z)                                 (S, d_ffn/2)    spatial gating unit
    Y  = X + Z~ V + b_V                       (S, C)          channel projection out

The SGU splits Z along channels into Z_1 (bypass) and Z_2 (gate), normalises the gate and
mixes it across tokens with one S x S matrix:

    s(Z) = Z_1 * (W LN(Z_2) + b)              W near zero and b = 1 at init, so s(Z) ~ Z_1

(``sgu_variant`` picks the paper's other forms: "linear" f(Z), "additive" Z + f(Z),
"multiplicative" Z * f(Z); ``toeplitz`` constrains W to a shift-invariant "1d" or "2d"
Toeplitz matrix.) There is no separate feed-forward network and no position embedding: W
sees positions.

aMLP adds a tiny single-head attention, computed from the block's *normalised input* X^
(not from Z) and added inside the gate, after W LN(Z_2) + b and before the product with Z_1:

    s(Z) = Z_1 * (W LN(Z_2) + b + TinyAttn(X^))

The classifier ends like Mixer's: LayerNorm, mean over tokens, zero-initialised head.
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..nn import LayerNorm, Linear, Module, PatchEmbedding, Sequential, SpatialGatingUnit, TinyAttention, init
from .mixer import check_gelu, require_positive

__all__ = ["GMLPBlock", "GMLP", "AMLP"]


def gate_width(ffn_dim, sgu_variant="split"):
    """Width of the SGU output: d_ffn/2 for the split variant (Z_1 only), d_ffn otherwise."""
    if sgu_variant == "split":
        if ffn_dim % 2:
            raise ValueError(f"gMLP: the split SGU halves ffn_dim, which must be even (got {ffn_dim})")
        return ffn_dim // 2
    return ffn_dim


class GMLPBlock(Module):
    """Y = X + s(GELU(LN(X) U)) V on tokens x of shape (B, S, dim).

    With ``attn_dim`` set it is an aMLP block: ``attn`` (TinyAttention on X^ = LN(X)) feeds the
    SGU's gate residual. ``mask`` (B, S) marks the real tokens of padded text for the attention.
    ``sgu_eps`` is the eps of the SGU's LayerNorm (None: ``eps``; timm's gMLP uses 1e-5).
    """

    def __init__(self, seq_len, dim, ffn_dim, attn_dim=None, sgu_variant="split", toeplitz=None,
                 causal=False, grid=None, eps=1e-6, gelu="tanh", sgu_eps=None, rng=None):
        super().__init__()
        width = gate_width(ffn_dim, sgu_variant)
        self.causal = causal
        self.approximate = check_gelu(gelu) == "tanh"
        self.norm = LayerNorm(dim, eps=eps)
        self.proj_in = Linear(dim, ffn_dim, rng=rng)
        self.sgu = SpatialGatingUnit(seq_len, ffn_dim, variant=sgu_variant, toeplitz=toeplitz, causal=causal,
                                     grid=grid, eps=eps if sgu_eps is None else sgu_eps, rng=rng)
        self.proj_out = Linear(width, dim, rng=rng)
        self.attn = TinyAttention(dim, width, attn_dim, rng=rng) if attn_dim else None

    def forward(self, x, mask=None):                                   # x: (B, S, dim)
        h = self.norm(x)                                               # X^ = LN(X)          (B, S, dim)
        z = F.gelu(self.proj_in(h), self.approximate)                  # Z = GELU(X^ U + b)  (B, S, ffn)
        a = None
        if self.attn is not None:
            a = self.attn(h, mask=mask, causal=self.causal)            # TinyAttn(X^)        (B, S, ffn/2)
        s = self.sgu(z, gate_residual=a)                               # s(Z)                (B, S, ffn/2)
        return x + self.proj_out(s)                                    # Y = X + s(Z) V + b  (B, S, dim)


class GMLP(Module):
    """gMLP image classifier (aMLP with ``attn_dim``): images (B, C_in, H, W) -> logits (B, num_classes).

    ``toeplitz``: None (dense W), "1d" (Toeplitz over the token index) or "2d" (Toeplitz over
    the patch grid, the shift-invariant form for images; ``True`` means "2d").
    """

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, ffn_dim,
                 attn_dim=None, sgu_variant="split", toeplitz=None, causal=False, eps=1e-6,
                 gelu="tanh", sgu_eps=None, seed=0):
        super().__init__()
        require_positive(type(self).__name__, num_classes=num_classes, dim=dim, depth=depth, ffn_dim=ffn_dim)
        if toeplitz is True:
            toeplitz = "2d"
        toeplitz = toeplitz or None
        self.config = dict(image_size=image_size, patch_size=patch_size, in_channels=in_channels,
                           num_classes=num_classes, dim=dim, depth=depth, ffn_dim=ffn_dim,
                           attn_dim=attn_dim, sgu_variant=sgu_variant, toeplitz=toeplitz,
                           causal=causal, eps=eps, gelu=check_gelu(gelu), sgu_eps=sgu_eps, seed=seed)
        rng = np.random.default_rng(seed)
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim, rng=rng)
        seq_len, grid = self.patch_embed.num_patches, self.patch_embed.grid
        self.blocks = Sequential(*[
            GMLPBlock(seq_len, dim, ffn_dim, attn_dim, sgu_variant, toeplitz, causal, grid, eps, gelu, sgu_eps, rng=rng)
            for _ in range(depth)
        ])
        self.norm = LayerNorm(dim, eps=eps)
        self.head = Linear(dim, num_classes, rng=rng)
        init.zeros(self.head.weight)           # zero head: initial logits 0, initial loss ln(K)
        init.zeros(self.head.bias)

    def forward(self, images):                 # images: (B, C_in, H, W)
        x = self.patch_embed(images)           # (B, S, dim)
        x = self.blocks(x)                     # (B, S, dim)
        x = self.norm(x).mean(axis=1)          # (B, dim): the average over tokens
        return self.head(x)                    # (B, num_classes)


class AMLP(GMLP):
    """aMLP: gMLP with a tiny single-head attention of width ``attn_dim`` (64 in the paper)."""

    def __init__(self, *args, attn_dim=64, **kwargs):
        if not attn_dim:
            raise ValueError("AMLP needs attn_dim > 0 (use GMLP for no attention)")
        super().__init__(*args, attn_dim=attn_dim, **kwargs)
