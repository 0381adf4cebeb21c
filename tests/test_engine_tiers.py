"""The two engines agree: the reference engine (tinymlp/autograd.py) and the fast engine
(tinymlp/fast/engine.py) give the same float64 loss and gradients on every model.

Three runs of one model, batch and weights: the whole reference tier (``fast.disabled()``), the
fast ops under the reference engine (``fast.reference_engine()``) and the fast tier as it runs by
default. The fast engine's savings (a pending bias, early frees) change no result, so its run
equals the one with the same ops under the reference engine to rounding; the fast ops equal the
reference ops to float64 rounding of other summation orders. Each run also counts the pending
biases, so a comparison that exercised none would fail instead of passing vacuously.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp import Tensor, autograd, fast
from tinymlp.fast import compiled
from tinymlp.fast import engine as fast_engine
from tinymlp.models import AMLP, GMLP, MLPMixer, TextGMLP, ViT

IMAGES = dict(image_size=8, patch_size=4, in_channels=3, num_classes=5)
MODELS = {
    "mixer": lambda: MLPMixer(**IMAGES, dim=8, depth=2, token_mlp_dim=6, channel_mlp_dim=12),
    "gmlp": lambda: GMLP(**IMAGES, dim=8, depth=2, ffn_dim=12),
    "gmlp_toeplitz2d": lambda: GMLP(**IMAGES, dim=8, depth=1, ffn_dim=12, toeplitz="2d"),
    "amlp": lambda: AMLP(**IMAGES, dim=8, depth=2, ffn_dim=12, attn_dim=4),
    "vit": lambda: ViT(**IMAGES, dim=8, depth=2, heads=2, mlp_dim=12),
    "text_gmlp_multiplicative": lambda: TextGMLP(vocab_size=20, seq_len=6, dim=8, depth=2, ffn_dim=12,
                                                 sgu_variant="multiplicative"),
    "text_amlp_causal": lambda: TextGMLP(vocab_size=20, seq_len=6, dim=8, depth=2, ffn_dim=12, attn_dim=4,
                                         causal=True),
}


def _inputs(name, rng):
    if name.startswith("text"):
        return rng.integers(0, 20, size=(3, 6)), rng.integers(0, 2, size=3)
    return rng.normal(size=(3, 3, 8, 8)), rng.integers(0, 5, size=3)


def _randomized(model, rng):
    """Weights drawn at scale 0.3 (the zero-initialised head would make most gradients zero)."""
    for _, p in model.named_parameters():
        p.data[...] = 0.3 * rng.standard_normal(p.shape)
    return model


@contextlib.contextmanager
def _counting(counts):
    """Count the fast engine's savings as they fire: pending biases left, and taken by the next op."""
    wrap, hand_over = fast_engine.PendingBias.wrap, fast_engine.FastEngine.hand_over

    def counted_wrap(cls, raw, bias, grad_fn):
        counts["pending bias"] += 1
        return wrap.__func__(cls, raw, bias, grad_fn)

    def counted_hand_over(self, impl, args, arrays, kwargs, i):
        out = hand_over(self, impl, args, arrays, kwargs, i)
        counts["bias taken"] += len(out) > len(kwargs)
        return out

    fast_engine.PendingBias.wrap, fast_engine.FastEngine.hand_over = classmethod(counted_wrap), counted_hand_over
    try:
        yield
    finally:
        fast_engine.PendingBias.wrap, fast_engine.FastEngine.hand_over = wrap, hand_over


def _run(name, tier, seed=0):
    """(loss, {parameter: gradient}, savings counted) of one forward and backward in float64."""
    rng = np.random.default_rng(seed)
    tinymlp.manual_seed(seed)
    counts = {"pending bias": 0, "bias taken": 0}
    switch = {"reference": fast.disabled, "fast ops, reference engine": fast.reference_engine,
              "fast": fast.enabled}[tier]
    with switch(), _counting(counts):
        model = _randomized(MODELS[name]().to(dtype="float64"), rng)
        x, y = _inputs(name, rng)
        x = x if name.startswith("text") else Tensor(x, dtype="float64")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    return float(loss.item()), {n: p.grad.copy() for n, p in model.named_parameters() if p.grad is not None}, counts


@pytest.mark.parametrize("name", list(MODELS))
def test_both_engines_give_the_same_float64_gradients(name):
    reference, ref_engine, fastest = (_run(name, tier) for tier in
                                      ("reference", "fast ops, reference engine", "fast"))
    assert set(reference[1]) == set(fastest[1]) == set(ref_engine[1])
    for run, rtol in ((ref_engine, 1e-9), (fastest, 1e-9)):
        np.testing.assert_allclose(run[0], reference[0], rtol=1e-12)
        for key, g in reference[1].items():
            np.testing.assert_allclose(run[1][key], g, rtol=rtol, atol=1e-12, err_msg=f"{name}: {key}")
    for key, g in ref_engine[1].items():                   # same ops: the engines alone differ
        np.testing.assert_allclose(fastest[1][key], g, rtol=1e-12, atol=1e-14, err_msg=f"{name}: {key}")
    assert not any(reference[2].values()) and not any(ref_engine[2].values()), "the reference engine saved nothing"
    if compiled.available() and not name.startswith("vit"):
        assert fastest[2]["pending bias"] and fastest[2]["bias taken"], fastest[2]


def test_the_switches_choose_the_engine():
    assert autograd.engine() is fast_engine.ENGINE
    with fast.reference_engine():
        assert autograd.engine() is autograd.REFERENCE
        assert fast.is_enabled()                            # the ops stay fast
    with fast.disabled():
        assert autograd.engine() is autograd.REFERENCE
    assert autograd.engine() is fast_engine.ENGINE
