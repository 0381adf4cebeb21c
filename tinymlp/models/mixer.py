"""MLP-Mixer (Tolstikhin et al., 2021, "MLP-Mixer: An all-MLP Architecture for Vision").

An image is cut into S non-overlapping P x P patches, each projected to C channels, giving a
table X of S tokens by C channels. Every block mixes that table twice, each time with a plain
two-layer MLP and a pre-LayerNorm residual:

    U_{*,i} = X_{*,i} + W_2 GELU(W_1 LN(X)_{*,i})      token mixing: the same MLP on every column i
    Y_{j,*} = U_{j,*} + W_4 GELU(W_3 LN(U)_{j,*})      channel mixing: the same MLP on every row j

A column of X holds one channel across all S tokens, so token mixing is an MLP over the S
axis, applied to the transpose: ``token_mlp(LN(X)^T)^T``. The hidden widths follow the paper:
D_S = tokens_mlp_dim (about C/2, a bottleneck over tokens) and D_C = channels_mlp_dim (4C,
an expansion over channels). After the last block: LayerNorm, the mean over tokens, and a
linear head initialised to zero, so every class starts with logit 0 and the first loss is
exactly ln(K).

As in the official code there is no position embedding and no class token (token mixing
sees positions through its weights), GELU is the tanh form (``gelu="exact"`` for the erf
form of PyTorch ports) and LayerNorm uses eps = 1e-6.
"""

from __future__ import annotations

import numpy as np

from .. import functional as F
from ..nn import Dropout, LayerNorm, Linear, Module, PatchEmbedding, Sequential, init

__all__ = ["MLP", "MixerBlock", "MLPMixer"]

GELU_FORMS = ("tanh", "exact")


class MLP(Module):
    """Dense(dim -> hidden_dim) -> GELU -> Dense(hidden_dim -> dim), over the last axis."""

    def __init__(self, dim, hidden_dim, dropout=0.0, gelu="tanh", rng=None):
        super().__init__()
        self.fc1 = Linear(dim, hidden_dim, rng=rng)
        self.fc2 = Linear(hidden_dim, dim, rng=rng)
        self.drop = Dropout(dropout, rng=rng)
        self.approximate = check_gelu(gelu) == "tanh"

    def forward(self, x):                                          # x: (..., dim)
        h = self.drop(F.gelu(self.fc1(x), self.approximate))       # GELU(x W_1 + b_1)   (..., hidden)
        return self.drop(self.fc2(h))                              # h W_2 + b_2         (..., dim)


class MixerBlock(Module):
    """One Mixer layer on tokens x of shape (B, S, C): token mixing, then channel mixing.

    ``token_mlp.fc1.weight`` is (S, D_S) and ``channel_mlp.fc1.weight`` is (C, D_C). The
    channel LayerNorm reads the *updated* x, after the token-mixing residual.

    A curiosity kept from the official model: ``token_mlp.fc2.bias`` (one number per token)
    shifts all C channels of a token by the same amount, and every later reader of x is a
    LayerNorm over channels, which removes exactly such shifts. Its gradient is always zero.
    """

    def __init__(self, num_tokens, dim, token_mlp_dim, channel_mlp_dim, dropout=0.0, eps=1e-6,
                 gelu="tanh", rng=None):
        super().__init__()
        self.norm1 = LayerNorm(dim, eps=eps)
        self.token_mlp = MLP(num_tokens, token_mlp_dim, dropout, gelu, rng=rng)
        self.norm2 = LayerNorm(dim, eps=eps)
        self.channel_mlp = MLP(dim, channel_mlp_dim, dropout, gelu, rng=rng)

    def forward(self, x):                                          # x: (B, S, C)
        columns = self.norm1(x).swapaxes(1, 2)                     # LN(X)^T             (B, C, S)
        x = x + self.token_mlp(columns).swapaxes(1, 2)             # U = X + MLP_S(..)^T (B, S, C)
        x = x + self.channel_mlp(self.norm2(x))                    # Y = U + MLP_C(LN(U)) (B, S, C)
        return x


class MLPMixer(Module):
    """MLP-Mixer image classifier: images (B, C_in, H, W) -> logits (B, num_classes)."""

    def __init__(self, image_size, patch_size, in_channels, num_classes, dim, depth,
                 token_mlp_dim, channel_mlp_dim, dropout=0.0, eps=1e-6, gelu="tanh", seed=0):
        super().__init__()
        require_positive("MLPMixer", num_classes=num_classes, dim=dim, depth=depth,
                         token_mlp_dim=token_mlp_dim, channel_mlp_dim=channel_mlp_dim)
        self.config = dict(image_size=image_size, patch_size=patch_size, in_channels=in_channels,
                           num_classes=num_classes, dim=dim, depth=depth, token_mlp_dim=token_mlp_dim,
                           channel_mlp_dim=channel_mlp_dim, dropout=dropout, eps=eps,
                           gelu=check_gelu(gelu), seed=seed)
        rng = np.random.default_rng(seed)
        # a Linear on each flattened P x P patch (a conv with kernel = stride = P), with bias
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim, rng=rng)
        num_tokens = self.patch_embed.num_patches
        self.blocks = Sequential(*[
            MixerBlock(num_tokens, dim, token_mlp_dim, channel_mlp_dim, dropout, eps, gelu, rng=rng)
            for _ in range(depth)
        ])
        self.norm = LayerNorm(dim, eps=eps)
        self.head = Linear(dim, num_classes, rng=rng)
        init.zeros(self.head.weight)           # zero head: initial logits 0, initial loss ln(K)
        init.zeros(self.head.bias)

    def forward(self, images):                 # images: (B, C_in, H, W)
        x = self.patch_embed(images)           # (B, S, C)
        x = self.blocks(x)                     # (B, S, C)
        x = self.norm(x).mean(axis=1)          # (B, C): the average over tokens
        return self.head(x)                    # (B, num_classes)


def check_gelu(gelu):
    """``gelu`` is "tanh" (the official models, Flax) or "exact" (erf, PyTorch's default)."""
    if gelu not in GELU_FORMS:
        raise ValueError(f"gelu must be one of {GELU_FORMS}, got {gelu!r}")
    return gelu


def require_positive(model, **sizes):
    """Every size must be an integer >= 1: a model with depth 0 or width 0 is a mistake."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{model}: {name} must be an integer >= 1, got {value!r}")
