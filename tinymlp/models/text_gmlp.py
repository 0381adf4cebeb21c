"""gMLP and aMLP on text (the course work's section 3.3-3.5; Liu et al. 2021, section 4).

Token ids (B, S), padded with [PAD] to a fixed S (the SGU's S x S matrix is tied to it), are
embedded as in BERT and go through the same blocks as the image gMLP:

    X   = E[ids] (+ T[segment]) (+ P)               (B, S, C)   token (+ segment, + position) embedding
    X^  = LN(X)
    Z   = GELU(X^ U + b_U)                           (B, S, d_ffn)
    Y   = X + s(Z) V + b_V,  s(Z) = Z_1 * (W LN(Z_2) + b [+ TinyAttn(X^)])     aMLP adds the bracket

(the blocks are ``tinymlp.models.gmlp.GMLPBlock``, the image gMLP's, given the padding mask) and
end in one of two heads:

- classification: LN, then the mean over the *real* tokens (the padding mask m = ids != [PAD]:
  sum_i m_i x_i / sum_i m_i) or the [CLS] token (``pooling="cls"``), then a zero-initialised
  Linear: logits (B, num_classes);
- language model (``lm_head=True``): LN, then logits = h E^T + b over the vocabulary at every
  position, with E the input table (tied). Masked-LM pretraining predicts the ids hidden behind
  [MASK]; ``causal=True`` makes every SGU (and tiny attention) look only left, for a
  left-to-right LM.

Sentence pairs ``[CLS] a [SEP] b [SEP]`` get segment embeddings T[0] for ``[CLS] a [SEP]`` and
T[1] for ``b [SEP]``; the segments are read off the ids (after the first [SEP]) unless given.
The padding mask also hides the padding keys from the tiny attention, whose output projection
starts at zero here (tinymlp's choice; the paper's code draws it at random): an aMLP block then
starts as the gMLP block, whose gate starts at W ~ 0, b = 1. A random start adds noise of the
bias's size to every gate; in small runs on the generated pair tasks it kept aMLP near chance
for epochs, where the silent start learned. gMLP needs no position embedding (W sees
positions); ``position="learned"`` or ``"sinusoidal"`` adds one (the fixed sinusoidal table is
scaled by 0.02, the size of the token embeddings, which it would drown otherwise).

The course work's text configurations are presets beside the image ones:
``tinymlp.models.create("gmlp_text18")``, ``num_parameters("gmlp_text18")`` (``presets.py``).
"""

from __future__ import annotations

import numpy as np

from ..backend import array_module
from ..nn import Embedding, LayerNorm, Linear, Module, ModuleList, PositionEmbedding, TiedLMHead, init
from ..ops import reshape
from ..tensor import Tensor
from .gmlp import GMLPBlock
from .vit import sinusoidal_embedding

__all__ = ["TextGMLP"]

PAD_ID, SEP_ID, MASK_ID = 0, 3, 4      # tinymlp.data.tokenizer's ids of [PAD], [SEP] and [MASK]


def _ids_array(ids):
    """The array of a Tensor of ids; an array as it is (a CuPy array's ``.data`` is its memory pointer)."""
    return ids.data if isinstance(ids, Tensor) else ids


class TextGMLP(Module):
    """gMLP (aMLP with ``attn_dim``) on token ids (B, seq_len): class logits (B, num_classes),
    and with ``lm_head`` the vocabulary logits of every position, ``model.token_logits(ids)``."""

    def __init__(self, vocab_size, seq_len=128, dim=128, depth=6, ffn_dim=768, num_classes=2, attn_dim=None,
                 sgu_variant="split", toeplitz=None, causal=False, pooling="mean", segments=True,
                 position=None, lm_head=False, eps=1e-6, seed=0):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"TextGMLP: pooling must be 'mean' or 'cls', got {pooling!r}")
        if position not in (None, "learned", "sinusoidal"):
            raise ValueError(f"TextGMLP: position must be None, 'learned' or 'sinusoidal', got {position!r}")
        toeplitz = toeplitz or None
        self.config = dict(vocab_size=vocab_size, seq_len=seq_len, dim=dim, depth=depth, ffn_dim=ffn_dim,
                           num_classes=num_classes, attn_dim=attn_dim, sgu_variant=sgu_variant,
                           toeplitz=toeplitz, causal=causal, pooling=pooling, segments=segments,
                           position=position, lm_head=lm_head, eps=eps, seed=seed)
        rng = np.random.default_rng(seed)
        self.seq_len, self.pooling = int(seq_len), pooling
        self.embed = Embedding(vocab_size, dim, rng=rng)
        self.segment = Embedding(2, dim, rng=rng) if segments else None
        self.position = None
        if position is not None:
            # the sinusoidal table (values in [-1, 1]) scaled to the token rows' 0.02: else it drowns them
            table = 0.02 * sinusoidal_embedding(seq_len, dim) if position == "sinusoidal" else None
            self.position = PositionEmbedding(seq_len, dim, table=table, rng=rng)
        self.blocks = ModuleList([
            GMLPBlock(seq_len, dim, ffn_dim, attn_dim, sgu_variant, toeplitz, causal, eps=eps, rng=rng)
            for _ in range(depth)
        ])
        for block in self.blocks:                            # aMLP starts as gMLP: a silent attention
            if block.attn is not None:
                init.zeros(block.attn.out.weight)
        self.norm = LayerNorm(dim, eps=eps)
        self.head = None
        if num_classes:
            self.head = Linear(dim, num_classes, rng=rng)
            init.zeros(self.head.weight)                     # first loss: ln(num_classes)
        self.lm_head = TiedLMHead(self.embed) if lm_head else None

    # ------------------------------------------------------------------ the body
    def features(self, ids, segments=None):
        """LN of the last block's tokens (B, S, dim), and the padding mask (B, S) bool."""
        ids = _ids_array(ids)
        B, S = ids.shape
        if S != self.seq_len:
            raise ValueError(f"TextGMLP: ids of shape {tuple(ids.shape)}, expected (B, {self.seq_len}): "
                             f"pad or cut every sequence to seq_len={self.seq_len} (Tokenizer.encode max_len)")
        xp = array_module(ids)
        mask = ids != PAD_ID                                                     # real tokens
        x = self.embed(ids)                                                      # (B, S, C)
        if self.segment is not None:
            if segments is None:                                                 # 1 after the first [SEP]
                is_sep = ids == SEP_ID
                segments = xp.minimum(xp.cumsum(is_sep, axis=1) - is_sep, 1) * mask
            x = x + self.segment(_ids_array(segments))
        if self.position is not None:
            x = self.position(x)
        for block in self.blocks:
            x = block(x, mask=mask)
        return self.norm(x), mask

    def forward(self, ids, segments=None):
        """Class logits (B, num_classes). A language model (``num_classes=0``, ``lm_head``) gives
        the vocabulary logits its loss needs, rows in row-major order: masked LM, those of the
        [MASK] positions (P, V); causal LM, every position (B * S, V), to predict the next id.
        The [MASK] positions are the ``mask_positions`` of ``ids`` where it has them (the batches
        of ``MaskedLMLoader``, found on the host), else found here."""
        if self.head is None:
            if self.lm_head is None:
                raise RuntimeError("TextGMLP: built with neither num_classes nor lm_head")
            if self.config["causal"]:
                return reshape(self.token_logits(ids, segments), (-1, self.embed.num_embeddings))
            positions = getattr(ids, "mask_positions", None)   # MaskedLMLoader found them on the host
            ids = _ids_array(ids)
            if positions is None:     # (on a GPU, flatnonzero waits for the device to size its output)
                positions = array_module(ids).flatnonzero(ids == MASK_ID)
            return self.token_logits(ids, segments, positions=positions)
        h, mask = self.features(ids, segments)
        if self.pooling == "cls":
            pooled = h[:, 0]                                                     # the [CLS] token
        else:                                                                    # mean over real tokens
            m = mask.astype(h.dtype)
            count = xp_max(m.sum(axis=1, keepdims=True), 1.0)
            pooled = (h * m[:, :, None]).sum(axis=1) / count                     # (B, C)
        return self.head(pooled)                                                 # (B, num_classes)

    def token_logits(self, ids, segments=None, positions=None):
        """Vocabulary logits (B, S, V) through the tied head; with ``positions`` (an index into
        the flattened B*S tokens) only those rows, (P, V): what masked-LM training needs."""
        if self.lm_head is None:
            raise RuntimeError("TextGMLP: built without lm_head=True")
        h, _ = self.features(ids, segments)
        if positions is not None:
            h = reshape(h, (-1, h.shape[-1]))[positions]
        return self.lm_head(h)


def xp_max(a, floor):
    return array_module(a).maximum(a, floor)
