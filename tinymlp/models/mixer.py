"""MLP-Mixer (Tolstikhin et al., 2021, "MLP-Mixer: An all-MLP Architecture for Vision").

An image is cut into S non-overlapping P x P patches, each projected to C channels, giving a
table X of S tokens by C channels. Every block mixes that table twice, each time with a plain
two-layer MLP and a pre-LayerNorm residual:

    U = X + T(MLP_S(T(LN_1(X))))        token mixing: one MLP along the S axis, shared by channels
    Y = U + MLP_C(LN_2(U))              channel mixing: one MLP along the C axis, shared by tokens

with T the transpose (S, C) <-> (C, S) and MLP_D(x) = GELU(x W_1 + b_1) W_2 + b_2. The hidden
widths follow the paper: D_S = tokens_mlp_dim (about C/2, a bottleneck over tokens) and
D_C = channels_mlp_dim (4C, an expansion over channels). After the last block: LayerNorm,
the mean over tokens, and a linear head initialised to zero, so every class starts with
logit 0 and the first loss is exactly ln(K).

As in the official code there is no position embedding and no class token (token mixing
sees positions through its weights), GELU is the tanh form and LayerNorm uses eps = 1e-6.

Layout. MLPMixer keeps its activations *token-major*, (S, B, C), between the stem and the
head. Channel mixing and the LayerNorms work on the last axis either way, and token mixing
becomes a Linear along axis 0: T(MLP_S(T(.))) is then W^T X for one (S, B*C) matrix X, a
single matrix product with no transposed copy of the activations (see ``F.linear``'s
``axis``). A MixerBlock takes the usual (B, S, C) by default; the model calls its blocks
with ``token_axis=0``.
"""

from __future__ import annotations

import numpy as np

from ..nn import Dropout, LayerNorm, Linear, Module, Sequential
from .classifier import PatchClassifier

__all__ = ["MLP", "MixerBlock", "MLPMixer"]


class MLP(Module):
    """Dense(dim -> hidden_dim) -> GELU -> Dense(hidden_dim -> dim), along axis ``axis`` of
    the input (the last one by default). The GELU is part of ``fc1`` (``activation="gelu"``):
    one op computes the product, the bias and the activation in one pass over the hidden units."""

    def __init__(self, dim, hidden_dim, dropout=0.0, rng=None):
        super().__init__()
        self.fc1 = Linear(dim, hidden_dim, rng=rng, activation="gelu")
        self.fc2 = Linear(hidden_dim, dim, rng=rng)
        self.drop = Dropout(dropout, rng=rng)

    def forward(self, x, axis=-1):
        h = self.drop(self.fc1(x, axis=axis))     # GELU(x W1 + b1) along ``axis``
        return self.drop(self.fc2(h, axis=axis))


class MixerBlock(Module):
    """One Mixer layer on tokens x of shape (B, S, C): token mixing, then channel mixing.

    Each sub-block has its own LayerNorm, and the channel LayerNorm reads the *updated* x,
    after the token-mixing residual. ``token_mlp.fc1.weight`` is (S, D_S) and
    ``channel_mlp.fc1.weight`` is (C, D_C). The token MLP runs along ``token_axis`` of x:
    1 for (B, S, C), 0 for the token-major (S, B, C) that MLPMixer uses (no transposes).

    A curiosity kept from the official model: ``token_mlp.fc2.bias`` (one number per token)
    shifts all C channels of a token by the same amount, and every later reader of x is a
    LayerNorm over channels, which removes exactly such shifts. Its gradient is always zero.
    """

    def __init__(self, num_tokens, dim, token_mlp_dim, channel_mlp_dim, dropout=0.0, eps=1e-6, rng=None):
        super().__init__()
        self.norm1 = LayerNorm(dim, eps=eps)
        self.token_mlp = MLP(num_tokens, token_mlp_dim, dropout, rng=rng)
        self.norm2 = LayerNorm(dim, eps=eps)
        self.channel_mlp = MLP(dim, channel_mlp_dim, dropout, rng=rng)

    def forward(self, x, token_axis=1):
        x = x + self.mix_tokens(self.norm1(x), token_axis)   # along tokens, shared by channels
        x = x + self.channel_mlp(self.norm2(x))              # along channels, shared by tokens
        return x

    def mix_tokens(self, h, token_axis=1):
        """The token MLP along the token axis of h, shared by every channel (no transposes)."""
        return self.token_mlp(h, axis=token_axis)


class MLPMixer(PatchClassifier):
    """MLP-Mixer image classifier: images (B, C_in, H, W) -> logits (B, num_classes).

    Stem, pooling and head are ``PatchClassifier``'s (classifier.py); the blocks are MixerBlocks.
    """

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth,
                 token_mlp_dim, channel_mlp_dim, dropout=0.0, eps=1e-6, seed=0):
        rng = np.random.default_rng(seed)
        super().__init__(image_size, patch_size, in_channels, dim, rng)
        self.config = dict(image_size=image_size, patch_size=patch_size, in_channels=in_channels,
                           num_classes=num_classes, dim=dim, depth=depth, token_mlp_dim=token_mlp_dim,
                           channel_mlp_dim=channel_mlp_dim, dropout=dropout, eps=eps, seed=seed)
        num_tokens = self.patch_embed.num_patches
        self.blocks = Sequential(*[
            MixerBlock(num_tokens, dim, token_mlp_dim, channel_mlp_dim, dropout, eps, rng=rng)
            for _ in range(depth)
        ])
        self._add_head(dim, num_classes, eps, rng)
