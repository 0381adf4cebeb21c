"""Token and position embeddings, and the language-model head that shares the token table.

    emb = Embedding(vocab_size, dim)            # ids (B, S) int -> (B, S, dim)
    pos = PositionEmbedding(S, dim)             # learned: + P[:S], P (S, dim) trained
    pos = PositionEmbedding(S, dim, table=sinusoidal_embedding(S, dim))   # fixed (a buffer)
    head = TiedLMHead(emb)                      # (B, S, dim) -> (B, S, vocab): h E^T + b

Tying the output projection to the input table (Press and Wolf 2017; BERT does it) saves
V x D parameters and lets the gradient of the prediction also train the embedding: E gets
the scatter-add of the lookup *plus* h^T g from the head.

The sinusoidal table is ``tinymlp.models.sinusoidal_embedding`` (vit.py): layers do not import
models, so a model builds the table and hands it over.
"""

from __future__ import annotations

from .. import functional as F
from ..ops import transpose
from . import init
from .module import Module, Parameter

__all__ = ["Embedding", "PositionEmbedding", "TiedLMHead"]


class Embedding(Module):
    """A table of ``num_embeddings`` rows of width ``dim``: ``emb(ids)`` -> (*ids.shape, dim).

    ``.weight`` (V, dim) starts N(0, 0.02^2) truncated at 2 std (BERT's initialiser). The
    lookup is ``F.embedding`` (ops/embedding.py: gather forward, scatter-add backward).
    """

    def __init__(self, num_embeddings: int, dim: int, std: float = 0.02, rng=None):
        super().__init__()
        self.num_embeddings, self.dim = int(num_embeddings), int(dim)
        self.weight = Parameter(init.trunc_normal((self.num_embeddings, self.dim), init.as_rng(rng), std=std))

    def forward(self, ids):
        return F.embedding(self.weight, ids)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.dim}"


class PositionEmbedding(Module):
    """x + P[:S] for tokens x of shape (B, S, dim), S <= ``num_positions``.

    ``table=None``: P is learned (``.weight``, N(0, 0.02^2) truncated). ``table`` given (e.g.
    the sinusoidal one): P is that fixed array, a non-persistent buffer (``.table``; it is a
    function of the shape, so checkpoints need not carry it).
    """

    def __init__(self, num_positions: int, dim: int, table=None, rng=None):
        super().__init__()
        self.num_positions, self.dim = int(num_positions), int(dim)
        self.learned = table is None
        if self.learned:
            self.weight = Parameter(init.trunc_normal((self.num_positions, self.dim), init.as_rng(rng), std=0.02))
        else:
            if tuple(table.shape) != (self.num_positions, self.dim):
                raise ValueError(f"PositionEmbedding: table of shape {tuple(table.shape)}, expected "
                                 f"({self.num_positions}, {self.dim})")
            self.register_buffer("table", table.astype("float32"), persistent=False)

    def forward(self, x):
        S = x.shape[-2]
        if S > self.num_positions or x.shape[-1] != self.dim:
            raise ValueError(f"PositionEmbedding({self.num_positions}, {self.dim}): got tokens of shape "
                             f"{tuple(x.shape)}, expected (..., S <= {self.num_positions}, {self.dim})")
        P = self.weight if self.learned else self.table.astype(x.dtype)
        return x + (P if S == self.num_positions else P[:S])

    def extra_repr(self):
        return f"{self.num_positions}, {self.dim}, {'learned' if self.learned else 'fixed'}"


class TiedLMHead(Module):
    """logits = h E^T + b: the output projection is the input ``embedding``'s table (V, D).

    Only ``.bias`` (V,) is its own; ``embedding`` is kept as a reference, not a child, so the
    table is one parameter of the model (registered where the embedding lives).
    """

    def __init__(self, embedding: Embedding):
        super().__init__()
        object.__setattr__(self, "embedding", embedding)   # shared, not owned: no second copy
        self.bias = Parameter(init.zeros((embedding.num_embeddings,)))

    def forward(self, h):
        return F.linear(h, transpose(self.embedding.weight, (1, 0)), self.bias)   # (..., V)

    def extra_repr(self):
        return f"tied to Embedding({self.embedding.num_embeddings}, {self.embedding.dim})"
