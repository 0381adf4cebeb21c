"""A compiled kernel that fails to compile, to load from numba's cache or to run: the training step
goes on by the NumPy code, with one warning, and the kernels stay off for the process
(``compiled.kernel`` turns the failure into ``compiled.KernelFailed``; each kernel's wrapper
returns its "no kernel for these arrays", and the caller's NumPy code computes).

The failure is simulated by replacing the kernel pairs of fast/kernels/*_numba.py with functions
that raise as numba does when it cannot type a call. It may come at the first forward (every
kernel compiles on its first call), or after a forward the kernels ran, in backward: the gating
unit's and the LayerNorm's backward then compute from what the compiled forward saved (z, the
row statistics, W x_hat), which is not what the NumPy forward saves. Each step is compared with
the reference tier's step from the same weights, in float64: loss, gradients, and the weights
after AdamW.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp import fast
from tinymlp.fast import compiled
from tinymlp.fast.kernels import (activation_numba, attention_numba, elementwise_numba, gating_numba, norm_numba,
                                  optim_numba)

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba not installed: no compiled kernels")

MODULES = (activation_numba, attention_numba, elementwise_numba, gating_numba, norm_numba, optim_numba)
SIZES = {"mixer_cifar": dict(depth=2, dim=16, token_mlp_dim=8, channel_mlp_dim=32),
         "gmlp_cifar": dict(depth=2, dim=16, ffn_dim=32),
         "amlp_cifar": dict(depth=2, dim=16, ffn_dim=32, attn_dim=8)}
BACKWARD = {"LN_BACKWARD", "GATE_BACKWARD", "AFFINE", "MULTIPLY", "SOFTMAX_BACKWARD", "ADAM", "APPLY_UPDATE",
            "ADAM_STEP"}


def kernel_pairs():
    """``{(module, name): (serial, parallel)}``: every compiled kernel of the kernel modules."""
    return {(m, name): v for m in MODULES for name, v in vars(m).items()
            if isinstance(v, tuple) and len(v) == 2 and all(hasattr(k, "py_func") for k in v)}


def break_kernels(monkeypatch, names=None):
    """Replace the kernels (those ``names``, or all) by ones that raise as numba does."""
    def cannot_type(*args):
        raise TypeError("simulated: numba cannot type this call")

    for (module, name) in kernel_pairs():
        if names is None or name in names:
            monkeypatch.setattr(module, name, (cannot_type, cannot_type))


@pytest.fixture(autouse=True)
def kernels_back_on():
    before = compiled.is_enabled()
    yield
    compiled.set_enabled(before)


def one_step(name, monkeypatch=None, broken=None, when=None):
    """Loss, gradients and weights after one AdamW step of a small model in float64; with
    ``monkeypatch``, the kernels ``broken`` (None: all) fail from ``when`` on ("forward" or
    "backward"), else the reference tier runs."""
    rng = np.random.default_rng(0)
    x, y = rng.random((4, 3, 32, 32)), np.array([0, 3, 1, 7])
    model = tinymlp.models.create(name, seed=0, **SIZES[name]).to(dtype="float64")
    model.load_state_dict({k: v + 0.1 * rng.standard_normal(v.shape)       # no zero head: every gradient counts
                           for k, v in model.state_dict().items()})
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-2)
    with fast.enabled() if monkeypatch is not None else fast.disabled():
        if when == "forward":
            break_kernels(monkeypatch, broken)
        loss = F.cross_entropy(model(tinymlp.tensor(x, dtype="float64")), y)
        if when == "backward":
            break_kernels(monkeypatch, broken)
        loss.backward()
        grads = {n: p.grad.copy() for n, p in model.named_parameters()}
        optimizer.step()
    return float(loss.item()), grads, {n: p.data.copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(SIZES))
@pytest.mark.parametrize("when, broken", [("forward", None), ("backward", None), ("backward", BACKWARD),
                                          ("backward", {"LN_BACKWARD"})],
                         ids=["all-from-forward", "all-from-backward", "backward-kernels", "layernorm-backward"])
def test_a_failing_kernel_falls_back_to_the_numpy_code_with_one_warning(name, when, broken, monkeypatch):
    expected = one_step(name)
    assert compiled.is_enabled()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = one_step(name, monkeypatch, broken, when)
    said = [w for w in caught if "numba kernels failed" in str(w.message)]
    assert len(said) == 1 and "simulated" in str(said[0].message), [str(w.message) for w in caught]
    assert not compiled.is_enabled(), "the kernels stay off after one failed"
    assert "simulated" in compiled.describe()
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
    for part in (1, 2):
        assert got[part].keys() == expected[part].keys()
        for key in expected[part]:
            np.testing.assert_allclose(got[part][key], expected[part][key], rtol=1e-9, atol=1e-12, err_msg=key)


def test_a_failing_whole_adam_step_falls_back_to_the_array_code(monkeypatch):
    """The optimizer's one-pass AdamW step failing (its first launch) leaves every parameter to the
    array code: one warning, and the parameters and moments the reference step gives."""
    rng = np.random.default_rng(3)
    shapes = [(5, 3), (40,), (17, 2)] * 7                  # more than one launch's worth
    init = [rng.standard_normal(s) for s in shapes]
    grads = [rng.standard_normal(s) for s in shapes]

    def stepped():
        params = [tinymlp.tensor(a, requires_grad=True, dtype="float64") for a in init]
        optimizer = tinymlp.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
        for _ in range(2):
            for p, g in zip(params, grads):
                p.grad = g.copy()
            optimizer.step()
        return [p.data for p in params], [s["exp_avg_sq"] for s in optimizer.state[0]]

    with fast.disabled():
        expected = stepped()
    break_kernels(monkeypatch, {"ADAM_STEP"})
    with fast.enabled(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = stepped()
    said = [w for w in caught if "numba kernels failed" in str(w.message)]
    assert len(said) == 1 and "simulated" in str(said[0].message) and not compiled.is_enabled()
    for g, e in zip(got[0] + got[1], expected[0] + expected[1]):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-15)


def test_switching_the_kernels_on_again_forgets_the_failure(monkeypatch):
    break_kernels(monkeypatch)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert norm_numba.forward_rows(np.ones((2, 3)), None, None, 1e-5) is None
    assert not compiled.is_enabled() and "simulated" in compiled.describe()
    compiled.set_enabled(True)
    assert compiled.is_enabled() and "simulated" not in compiled.describe()


@pytest.mark.parametrize("name", ["gmlp_cifar", "amlp_cifar"])
def test_the_gating_units_layernorm_failing_after_its_gate_kernel_ran_falls_back(name, monkeypatch):
    """The hardest place to fail: the gate kernel has run (on the last backward G_F takes W x_hat's
    memory) when the LayerNorm kernel of the same backward fails; the LayerNorm's gradient then
    comes from the NumPy code on z2 and its row statistics, times GELU's handed-over derivative."""
    e = 24                                              # the gate's width (ffn_dim 48), not the model's 16
    monkeypatch.setitem(SIZES, name, dict(SIZES[name], ffn_dim=2 * e))
    expected = one_step(name)
    gate_ran = []
    run_gate = gating_numba._gate_backward_run

    def spy(*args, **kwargs):
        done = run_gate(*args, **kwargs)
        gate_ran.append(done is not None)
        return done

    def fails_on_the_gates_rows(kernel):
        def run(*args):                                 # _ln_backward(g, gs, x, xs, n, dim, ...)
            if args[5] == e:
                raise TypeError("simulated: numba cannot type this call")
            return kernel(*args)
        return run

    monkeypatch.setattr(gating_numba, "_gate_backward_run", spy)
    monkeypatch.setattr(norm_numba, "LN_BACKWARD", tuple(fails_on_the_gates_rows(k) for k in norm_numba.LN_BACKWARD))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = one_step(name, monkeypatch, broken=set(), when="backward")     # no kernel broken but those above
    assert gate_ran[:1] == [True], "the gate kernel ran before the LayerNorm's failed"
    assert sum("numba kernels failed" in str(w.message) for w in caught) == 1
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
    for key in expected[1]:
        np.testing.assert_allclose(got[1][key], expected[1][key], rtol=1e-9, atol=1e-12, err_msg=key)
