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

Layout. As MLPMixer, GMLP keeps its activations token-major, (S, B, dim), between the stem
and the head: the SGU's three (S, S) token-mixing products are then each one matrix product
over the whole batch, read and written without strided passes (see ``F.spatial_gating``).
A GMLPBlock takes the usual (B, S, dim) by default; the model calls it with ``token_axis=0``.
"""

from __future__ import annotations

import numpy as np

from ..nn import LayerNorm, Linear, Module, Sequential, SpatialGatingUnit, TinyAttention
from .classifier import PatchClassifier

__all__ = ["GMLPBlock", "GMLP", "AMLP"]


def gate_width(ffn_dim, sgu_variant="split"):
    """Width of the SGU output: d_ffn/2 for the split variant (Z_1 only), d_ffn otherwise."""
    if sgu_variant == "split":
        if ffn_dim % 2:
            raise ValueError(f"gMLP: the split SGU halves ffn_dim, which must be even (got {ffn_dim})")
        return ffn_dim // 2
    return ffn_dim


class GMLPBlock(Module):
    """x + proj_out(SGU(GELU(proj_in(LN(x))))), on tokens x of shape (B, S, dim).

    With ``attn_dim`` set it is an aMLP block: ``attn`` (TinyAttention on LN(x)) feeds the
    SGU's ``gate_residual``. ``block(x, token_axis=0)`` takes a token-major x, (S, B, dim), as
    GMLP does.
    """

    def __init__(self, seq_len, dim, ffn_dim, attn_dim=None, sgu_variant="split", toeplitz=None,
                 causal=False, grid=None, eps=1e-6, rng=None):
        super().__init__()
        width = gate_width(ffn_dim, sgu_variant)
        self.causal = causal
        self.norm = LayerNorm(dim, eps=eps)
        self.proj_in = Linear(dim, ffn_dim, rng=rng, activation="gelu")   # GELU(X^ U + b_U), fused
        self.sgu = SpatialGatingUnit(seq_len, ffn_dim, variant=sgu_variant, toeplitz=toeplitz,
                                     causal=causal, grid=grid, eps=eps, rng=rng)
        self.proj_out = Linear(width, dim, rng=rng)
        self.attn = TinyAttention(dim, width, attn_dim, rng=rng) if attn_dim else None

    def forward(self, x, token_axis=1):
        h = self.norm(x)
        gate_residual = None
        if self.attn is not None:
            gate_residual = self.attn(h, causal=self.causal, token_axis=token_axis)
        z = self.proj_in(h)
        return x + self.proj_out(self.sgu(z, gate_residual=gate_residual, token_axis=token_axis))


class GMLP(PatchClassifier):
    """gMLP image classifier (aMLP with ``attn_dim``): images (B, C_in, H, W) -> logits (B, num_classes).

    Stem, pooling and head are ``PatchClassifier``'s (classifier.py); the blocks are GMLPBlocks.
    ``toeplitz``: None (dense W), "1d" (Toeplitz over the token index) or "2d" (Toeplitz over
    the patch grid, the shift-invariant form for images; ``True`` means "2d").
    """

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth, ffn_dim,
                 attn_dim=None, sgu_variant="split", toeplitz=None, causal=False, eps=1e-6, seed=0):
        rng = np.random.default_rng(seed)
        super().__init__(image_size, patch_size, in_channels, dim, rng)
        if toeplitz is True:
            toeplitz = "2d"
        toeplitz = toeplitz or None
        self.config = dict(image_size=image_size, patch_size=patch_size, in_channels=in_channels,
                           num_classes=num_classes, dim=dim, depth=depth, ffn_dim=ffn_dim,
                           attn_dim=attn_dim, sgu_variant=sgu_variant, toeplitz=toeplitz,
                           causal=causal, eps=eps, seed=seed)
        seq_len, grid = self.patch_embed.num_patches, self.patch_embed.grid
        self.blocks = Sequential(*[
            GMLPBlock(seq_len, dim, ffn_dim, attn_dim, sgu_variant, toeplitz, causal, grid, eps, rng=rng)
            for _ in range(depth)
        ])
        self._add_head(dim, num_classes, eps, rng)


class AMLP(GMLP):
    """aMLP: gMLP with a tiny single-head attention of width ``attn_dim`` (64 in the paper)."""

    def __init__(self, *args, attn_dim=64, **kwargs):
        if not attn_dim:
            raise ValueError("AMLP needs attn_dim > 0 (use GMLP for no attention)")
        super().__init__(*args, attn_dim=attn_dim, **kwargs)
