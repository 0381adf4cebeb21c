"""What MLP-Mixer and gMLP share around their blocks: patches in, one class score per image out.

    x = PatchEmbedding(images)            (B, S, C)  tokens in row-major patch order
    x = x.transpose(1, 0, 2)              (S, B, C)  token-major, see below
    x = block(x, token_axis=0)            for every block
    logits = head(mean_over_tokens(LayerNorm(x)))

No position embedding and no class token: the token-mixing weights (Mixer) or the spatial
weights (gMLP) see positions. The head is initialised to zero, so every class starts with
logit 0 and the first loss is exactly ln(K).

Layout. The activations are kept *token-major*, (S, B, C), between the stem and the head.
Channel work and the LayerNorms use the last axis either way, and mixing along tokens becomes
one matrix product over axis 0 of an (S, B*C) matrix, with no transposed copy of the
activations per block (``F.linear(..., axis=0)``, ``F.spatial_gating(..., token_axis=0)``).
"""

from __future__ import annotations

from ..nn import LayerNorm, Linear, Module, PatchEmbedding, init

__all__ = ["PatchClassifier"]


class PatchClassifier(Module):
    """Stem, blocks (``self.blocks``, set by the subclass) and the pooled, zero-initialised head.

    A subclass calls ``super().__init__(...)`` (which builds the stem), then builds
    ``self.blocks`` (each block called as ``block(x, token_axis=0)``), then ``self._add_head(...)``.
    """

    def __init__(self, image_size, patch_size, in_channels, dim, rng):
        super().__init__()
        # a Linear on each flattened P x P patch (a conv with kernel = stride = P), with bias
        self.patch_embed = PatchEmbedding(image_size, patch_size, in_channels, dim, rng=rng)

    def _add_head(self, dim, num_classes, eps, rng):
        self.norm = LayerNorm(dim, eps=eps)
        self.head = Linear(dim, num_classes, rng=rng)
        init.zeros(self.head.weight)  # zero head: initial logits 0, initial loss ln(K)
        init.zeros(self.head.bias)

    def forward(self, images):
        x = self.patch_embed(images)          # (B, S, C)
        x = x.transpose(1, 0, 2)              # (S, B, C): token-major
        for block in self.blocks:
            x = block(x, token_axis=0)
        x = self.norm(x).mean(axis=0)         # global average over tokens: (B, C)
        return self.head(x)
