"""Lesson 6's checks: a Mixer block's parameter count (06.1), its token-mixing half built from
Linear layers (06.2), its floating-point operations (06.3)."""

from __future__ import annotations

import numpy as np

from ... import tensor
from ..registry import Wrong, exercise
from .common import array_of, close, gelu, integer, layer_norm, run_gradcheck, t64


@exercise("06.2", "token-mixing block from Linear layers", answer="TokenMixing", seed=10,
          reference="tinymlp/models/mixer.py (MixerBlock)",
          forbidden=("tinymlp.models.mixer.MixerBlock", "tinymlp.models.mixer.MLP"))
def token_mixing(cls, case):
    rng = case.rng
    S, C, H = case.pick((6, 5, 4), (4, 7, 3))
    block = cls(S, C, H, rng=0)
    for p in block.parameters():                      # away from the initial ones and zeros
        p.data[...] = rng.normal(size=p.shape) * 0.7
    x = rng.normal(size=(2, S, C))
    names = dict(block.named_parameters())
    get = {k: v.numpy().astype(np.float64) for k, v in names.items()}
    try:
        h = layer_norm(x, get["norm.weight"], get["norm.bias"], 1e-6)             # (B, S, C)
        hid = gelu(h.transpose(0, 2, 1) @ get["fc1.weight"] + get["fc1.bias"])   # (B, C, H)
        want = x + (hid @ get["fc2.weight"] + get["fc2.bias"]).transpose(0, 2, 1)
    except (KeyError, ValueError) as err:
        raise Wrong(f"expected parameters norm.weight/bias, fc1.weight/bias, fc2.weight/bias; got "
                    f"{sorted((k, tuple(v.shape)) for k, v in names.items())}") from err
    for p in block.parameters():
        p.data = p.data.astype(np.float64)
    got = block(tensor(x.copy(), dtype="float64"))
    around_the_mlp(array_of(got, "forward"), want, x, h)
    close("forward", got, want, rtol=1e-6, atol=1e-8)
    run_gradcheck(block, (t64(x),), case)


def around_the_mlp(got, want, x, normed):
    """Name what is wrong around the token MLP: the residual left out, added twice or taken after
    the LayerNorm, or the result left in the transposed (B, C, S) layout."""
    if got.shape == want.shape[:-2] + want.shape[:-3:-1] and want.shape[-1] != want.shape[-2]:
        raise Wrong(f"forward: shape {got.shape}, expected {want.shape}: the token MLP's output is still (B, C, S); "
                    "transpose it back to (B, S, C) before adding the residual")
    if got.shape != want.shape or np.allclose(got, want, rtol=1e-6, atol=1e-8):
        return
    for wrong, what in ((want - x, "the residual is missing: the block returns the token MLP's output alone; "
                                   "add the input back, U = X + (...)^T"),
                        (want + x, "the residual is added twice: U = X + (...)^T adds x once"),
                        (want - x + normed, "the residual adds LN(x), the normalised input; U = X + (...)^T adds "
                                            "the block's input x itself")):
        if np.allclose(got, wrong, rtol=1e-6, atol=1e-8):
            raise Wrong(f"forward: {what}")


@exercise("06.1", "a Mixer block's parameter count", answer="mixer_block_parameters",
          reference="tinymlp/models/mixer.py (MixerBlock)")
def parameter_count(mixer_block_parameters, case):
    sizes = case.pick([(16, 32, 24, 64), (196, 512, 256, 2048), (4, 3, 2, 5)],
                      [tuple(int(n) for n in case.rng.integers(2, 300, size=4)) for _ in range(3)])
    for S, C, DS, DC in sizes:
        want = 2 * (2 * C) + (S * DS + DS + DS * S + S) + (C * DC + DC + DC * C + C)
        got = integer(f"mixer_block_parameters({S}, {C}, {DS}, {DC})", mixer_block_parameters(S, C, DS, DC))
        if got != want:
            raise Wrong(f"mixer_block_parameters({S}, {C}, {DS}, {DC}) = {got}, expected {want} "
                        "(two LayerNorms with a weight and a bias each; two MLPs, each two Linears with biases)")


@exercise("06.3", "a Mixer block's floating-point operations", answer="mixer_block_flops",
          reference="tinymlp/models/mixer.py (MixerBlock)")
def flops(mixer_block_flops, case):
    sizes = case.pick([(16, 32, 24, 64), (196, 512, 256, 2048), (4, 3, 2, 5)],
                      [tuple(int(n) for n in case.rng.integers(2, 300, size=4)) for _ in range(3)])
    for S, C, DS, DC in sizes:
        want = 4 * S * DS * C + 4 * S * C * DC
        got = integer(f"mixer_block_flops({S}, {C}, {DS}, {DC})", mixer_block_flops(S, C, DS, DC))
        if got != want:
            raise Wrong(f"mixer_block_flops({S}, {C}, {DS}, {DC}) = {got}, expected {want} "
                        "(count the four matrix products, 2 operations per multiply-add)")
