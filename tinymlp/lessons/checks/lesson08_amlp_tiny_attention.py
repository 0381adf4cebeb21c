"""Lesson 8's checks: the attention weights from queries and keys (08.1) and tiny attention's
parameter count (08.2)."""

from __future__ import annotations

import math

from ... import tensor
from ..registry import Wrong, exercise
from .common import close, integer, softmax


@exercise("08.2", "tiny attention's parameter count", answer="tiny_attention_parameters",
          reference="tinymlp/nn/attention.py (TinyAttention)")
def parameter_count(tiny_attention_parameters, case):
    sizes = case.pick([(32, 64, 16), (256, 768, 64), (3, 5, 2)],
                      [tuple(int(n) for n in case.rng.integers(2, 500, size=3)) for _ in range(3)])
    for d_in, d_out, a in sizes:
        want = d_in * 3 * a + a * d_out + d_out
        got = integer(f"tiny_attention_parameters({d_in}, {d_out}, {a})", tiny_attention_parameters(d_in, d_out, a))
        if got != want:
            raise Wrong(f"tiny_attention_parameters({d_in}, {d_out}, {a}) = {got}, expected {want} "
                        "(the projection to q, k, v has no bias; the output projection has one)")


@exercise("08.1", "attention weights from queries and keys", answer="attention_weights", seed=14,
          reference="tinymlp/ops/attention.py (Attention.forward)",
          forbidden=("tinymlp.ops.attention.Attention",))
def weights(attention_weights, case):
    B, S, d = case.pick((2, 5, 4), (3, 6, 9))
    q, k = case.rng.normal(size=(B, S, d)), case.rng.normal(size=(B, S, d))
    want = softmax(q @ k.transpose(0, 2, 1) / math.sqrt(d))
    got = attention_weights(tensor(q.copy(), dtype="float64"), tensor(k.copy(), dtype="float64"))
    close("A = softmax(Q K^T / sqrt(d))", got, want)
