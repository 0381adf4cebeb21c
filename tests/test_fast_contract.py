"""The fast tier's contract: every fast implementation gives its reference's forward value and
every one of its gradients, over hypothesis shapes and memory layouts; whole training steps of
Mixer, gMLP and aMLP agree with the tier on and off; the switch works.

Each op test runs the same inputs twice, ``tinymlp.fast.enabled()`` and ``disabled()``, with
the same upstream gradient, and checks (float64) that the fast implementation really ran.
Layouts: C order; the token-major (S, B, C) memory behind a (B, S, C) array that the fast patch
embedding produces; and its ``swapaxes(1, 2)`` (MLP-Mixer's token mixing).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinymlp
import tinymlp.functional as F
from tinymlp import Tensor, autograd, dispatch, fast
from tinymlp.backend import to_device
from tinymlp.models import AMLP, GMLP, MLPMixer, create
from tinymlp.ops.activation import GELU
from tinymlp.ops.attention import Attention, SelfAttention, Softmax
from tinymlp.ops.dropout import Dropout
from tinymlp.ops.elementwise import Add
from tinymlp.ops.gating import SpatialGating, Toeplitz1d, Toeplitz2d
from tinymlp.ops.linear import Linear
from tinymlp.ops.loss import CrossEntropy
from tinymlp.ops.norm import LayerNorm
from tinymlp.ops.shape import GetItem, Patchify
from tinymlp.optim import SGD, Adam, AdamW
import tinymlp.fast.layout  # noqa: E402,F401  (fast.layout.memory_order)

LAYOUTS = ["C", "token-major", "token-major swapped"]


def laid_out(rng, shape, layout, device="cpu"):
    """A float64 array of ``shape`` (3-D) with the given memory layout (values random)."""
    if layout == "C":
        a = rng.standard_normal(shape)
    elif layout == "token-major":              # (B, S, C) seen, (S, B, C) in memory
        a = rng.standard_normal((shape[1], shape[0], shape[2])).transpose(1, 0, 2)
    else:                                      # (B, C, S) seen, (S, B, C) in memory
        a = rng.standard_normal((shape[2], shape[0], shape[1])).transpose(1, 2, 0)
    assert a.shape == tuple(shape)
    return to_device(a, device) if device != "cpu" else a


def run_both(fn, arrays, grad_seed=0, device="cpu", expect=None):
    """fn(*leaves) with the fast tier on, then off: ``[(out, grads), (out, grads)]``.

    ``expect``: the reference Function whose fast implementation must have made the output.
    """
    results = []
    for on in (True, False):
        leaves = [None if a is None else Tensor(a, requires_grad=True, dtype=a.dtype) for a in arrays]
        with (fast.enabled() if on else fast.disabled()):
            out = fn(*leaves)
            impl = fast.implementation(expect, device) if expect is not None else None
        if on and expect is not None:
            assert impl is not expect, f"no fast implementation of {expect.__name__} on {device}"
            assert out.grad_fn is not None and out.grad_fn.fn is impl, (out.grad_fn, impl)
        g = np.random.default_rng(grad_seed).standard_normal(out.shape)
        out.backward(to_device(g, device) if device != "cpu" else g)
        results.append((to_device(out.data, "cpu"),
                        [None if t is None else (None if t.grad is None else to_device(t.grad, "cpu"))
                         for t in leaves]))
    return results


def assert_same(results, rtol=1e-10, atol=1e-12, what=""):
    (out_fast, grads_fast), (out_ref, grads_ref) = results
    np.testing.assert_allclose(out_fast, out_ref, rtol=rtol, atol=atol, err_msg=f"{what}: forward")
    for i, (a, b) in enumerate(zip(grads_fast, grads_ref)):
        assert (a is None) == (b is None), f"{what}: gradient {i} missing on one side"
        if a is not None:
            scale = max(1.0, float(np.abs(b).max()))
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol * scale, err_msg=f"{what}: gradient {i}")


dims = st.integers(1, 6)


# --------------------------------------------------------------------------- op by op
@given(B=dims, S=dims, C=dims, d_out=dims, layout=st.sampled_from(LAYOUTS), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_linear(B, S, C, d_out, layout, bias, seed):
    rng = np.random.default_rng(seed)
    x = laid_out(rng, (B, S, C), layout)
    w, b = rng.standard_normal((x.shape[-1], d_out)), rng.standard_normal(d_out) if bias else None
    assert_same(run_both(lambda x, w, b: F.linear(x, w, b), [x, w, b], seed, expect=Linear), what=layout)


def test_linear_reads_a_token_major_swapped_view_as_one_product_and_keeps_its_layout():
    """MLP-Mixer's token mixing: no copy of x, and the output laid out like x (columns)."""
    x = laid_out(np.random.default_rng(0), (4, 8, 6), "token-major swapped")   # (B, C, S)
    w = np.random.default_rng(1).standard_normal((6, 5))
    with fast.enabled():
        y = F.linear(Tensor(x, dtype="float64"), Tensor(w, dtype="float64"))
    assert y.shape == (4, 8, 5)
    assert y.data.transpose(2, 0, 1).flags.c_contiguous          # (D, B, C) in memory, like x
    np.testing.assert_allclose(y.data, x @ w, rtol=1e-12)


@given(B=dims, S=dims, C=dims, layout=st.sampled_from(LAYOUTS), approximate=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gelu(B, S, C, layout, approximate, seed):
    x = 3 * laid_out(np.random.default_rng(seed), (B, S, C), layout)
    assert_same(run_both(lambda x: F.gelu(x, approximate), [x], seed, expect=GELU), what=layout)


def test_gelu_in_chunks_keeps_the_layout():
    """Larger than one CPU chunk, token-major: chunks cover it all, output laid out like x."""
    x = laid_out(np.random.default_rng(0), (64, 40, 33), "token-major")
    assert x.size > 1 << 16
    assert_same(run_both(F.gelu, [x], expect=GELU), what="chunked")
    with fast.enabled():
        y = F.gelu(Tensor(x, dtype="float64"))
    assert y.data.transpose(1, 0, 2).flags.c_contiguous


@given(B=dims, S=dims, C=dims, layout=st.sampled_from(LAYOUTS), affine=st.sampled_from(["both", "weight", "none"]),
       seed=st.integers(0, 2**16))
def test_layer_norm(B, S, C, layout, affine, seed):
    rng = np.random.default_rng(seed)
    x = laid_out(rng, (B, S, C), layout) * 2 + 1
    w = rng.standard_normal(x.shape[-1]) if affine != "none" else None
    b = rng.standard_normal(x.shape[-1]) if affine == "both" else None
    assert_same(run_both(lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5), [x, w, b], seed, expect=LayerNorm),
                what=f"{layout} {affine}")


def test_layer_norm_with_a_broadcast_upstream_gradient():
    """After a mean over tokens the gradient reaching a LayerNorm is a broadcast view."""
    x = laid_out(np.random.default_rng(2), (3, 5, 4), "token-major")
    w, b = np.ones(4) * 1.5, np.zeros(4)
    assert_same(run_both(lambda x, w, b: F.layer_norm(x, w, b).mean(axis=1), [x, w, b], expect=None))


@given(lead=st.lists(dims, min_size=1, max_size=2), n=dims, axis=st.sampled_from([-1, 0]), seed=st.integers(0, 2**16))
def test_softmax(lead, n, axis, seed):
    x = np.random.default_rng(seed).standard_normal((*lead, n)) * 3
    assert_same(run_both(lambda x: F.softmax(x, axis=axis), [x], seed, expect=Softmax))


@given(B=dims, n=dims, m=dims, d=dims, masked=st.booleans(), causal=st.booleans(), seed=st.integers(0, 2**16))
def test_attention(B, n, m, d, masked, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((B, n, d)), rng.standard_normal((B, m, d)), rng.standard_normal((B, m, d + 1))
    mask = rng.random((B, n, m)) > 0.3 if masked else None
    assert_same(run_both(lambda q, k, v: F.attention(q, k, v, mask=mask, causal=causal), [q, k, v], seed,
                         expect=Attention))


@given(B=dims, n=dims, d=dims, masked=st.booleans(), causal=st.booleans(), layout=st.sampled_from(["C", "token-major"]),
       seed=st.integers(0, 2**16))
def test_self_attention(B, n, d, masked, causal, layout, seed):
    rng = np.random.default_rng(seed)
    qkv = laid_out(rng, (B, n, 3 * d), layout)
    mask = rng.random((B, n, n)) > 0.3 if masked else None
    results = run_both(lambda qkv: F.self_attention(qkv, mask=mask, causal=causal), [qkv], seed, expect=SelfAttention)
    assert_same(results)


def test_self_attention_gradient_is_laid_out_like_its_input():
    qkv = Tensor(laid_out(np.random.default_rng(0), (4, 6, 9), "token-major"), requires_grad=True, dtype="float64")
    with fast.enabled():
        F.self_attention(qkv).sum().backward()
    assert qkv.grad.transpose(1, 0, 2).flags.c_contiguous


@given(B=dims, S=dims, C=dims, layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS)),
       pending=st.sampled_from([None, "a", "b", "both"]), broadcast=st.booleans(), seed=st.integers(0, 2**16))
def test_add(B, S, C, layouts, pending, broadcast, seed):
    """The residual sum: plain, or taking a Linear's pending bias from either input (any layouts),
    or against a broadcast row."""
    rng = np.random.default_rng(seed)
    a, h = laid_out(rng, (B, S, C), layouts[0]), laid_out(rng, (B, S, C), layouts[1])
    b = rng.standard_normal(C) if broadcast else laid_out(rng, (B, S, C), layouts[1])
    w, bias = rng.standard_normal((C, C)), rng.standard_normal(C)

    def residual(a, b, h, w, bias):
        if pending in ("a", "both"):
            a = F.linear(h, w, bias)
        if pending in ("b", "both"):
            b = F.linear(h * 2.0, w, bias)
        return a + b

    assert_same(run_both(residual, [a, b, h, w, bias], seed, expect=Add), what=f"{layouts} {pending}")


@given(B=dims, S=dims, e=dims, variant=st.sampled_from(["split", "linear", "additive", "multiplicative"]),
       residual=st.booleans(), causal=st.booleans(), layout=st.sampled_from(["C", "token-major"]),
       seed=st.integers(0, 2**16))
def test_spatial_gating(B, S, e, variant, residual, causal, layout, seed):
    rng = np.random.default_rng(seed)
    width = 2 * e if variant == "split" else e
    z = laid_out(rng, (B, S, width), layout)
    a = laid_out(rng, (B, S, e), layout) if residual else None
    arrays = [z, rng.standard_normal((S, S)), rng.standard_normal(S), rng.standard_normal(e),
              rng.standard_normal(e), a]

    def sgu(z, w, b, gamma, beta, a):
        return F.spatial_gating(z, w, b, gamma, beta, eps=1e-5, gate_residual=a, causal=causal, variant=variant)

    assert_same(run_both(sgu, arrays, seed, expect=SpatialGating), what=f"{variant} {layout}")


def test_spatial_gating_output_keeps_the_token_major_layout():
    rng = np.random.default_rng(0)
    z = laid_out(rng, (3, 4, 6), "token-major")
    with fast.enabled():
        out = F.spatial_gating(*(Tensor(a, dtype="float64") for a in (
            z, rng.standard_normal((4, 4)), np.ones(4), np.ones(3), np.zeros(3))))
    assert out.shape == (3, 4, 3) and out.data.transpose(1, 0, 2).flags.c_contiguous


@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_toeplitz(kind):
    rng = np.random.default_rng(0)
    if kind == "1d":
        w = rng.standard_normal(2 * 5 - 1)
        results = run_both(lambda w: F.toeplitz_1d(w, 5), [w], expect=Toeplitz1d)
    else:
        w = rng.standard_normal((3, 5))
        results = run_both(lambda w: F.toeplitz_2d(w, 2, 3), [w], expect=Toeplitz2d)
    assert_same(results)


@given(B=dims, C=st.integers(1, 3), gh=st.integers(1, 3), gw=st.integers(1, 3), p=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_patchify(B, C, gh, gw, p, seed):
    images = np.random.default_rng(seed).standard_normal((B, C, gh * p, gw * p))
    results = run_both(lambda im: F.patchify(im, p), [images], seed, expect=Patchify)
    assert_same(results)
    with fast.enabled():
        tokens = F.patchify(Tensor(images, dtype="float64"), p)
    assert tokens.shape == (B, gh * gw, C * p * p)
    assert tokens.data.transpose(1, 0, 2).flags.c_contiguous       # token-major memory


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("index", [(Ellipsis, slice(0, 2)), (slice(None), 1), (np.array([0, 2, 0]),)],
                         ids=["last-axis slice", "integer", "repeated rows"])
def test_getitem(layout, index):
    x = laid_out(np.random.default_rng(0), (3, 4, 5), layout)
    assert_same(run_both(lambda x: x[index], [x], expect=GetItem), what=layout)


def test_getitem_gradient_is_laid_out_like_its_input():
    x = Tensor(laid_out(np.random.default_rng(0), (3, 4, 6), "token-major"), requires_grad=True, dtype="float64")
    with fast.enabled():
        q = x[..., :2]
        q.sum().backward()
    assert x.grad.transpose(1, 0, 2).flags.c_contiguous


def test_every_registered_implementation_is_covered_here():
    tested = {Add, Linear, GELU, LayerNorm, Softmax, Attention, SelfAttention, SpatialGating, Toeplitz1d, Toeplitz2d,
              Patchify, GetItem,
              dispatch.OPTIMIZER_STEP,    # test_flat_optimizer_equals_the_readable_one_...
              dispatch.CLIP_GRAD_NORM,    # CUDA only: test_cuda.py, test_cuda_without_gpu.py
              Dropout,                    # CUDA only, its own masks by design: the same two files
              CrossEntropy,               # CUDA only: the same two files
              dispatch.ENGINE}            # the fast engine: tests/test_engine_tiers.py
    registered = {ref for (ref, _device) in fast.implementations()}
    assert registered <= tested, f"fast implementations without a contract test: {registered - tested}"


def test_the_table_is_what_the_engine_and_the_optimizers_look_up():
    """One dispatch mechanism: every row of ``fast.TABLE`` is registered for its devices, each
    class subclasses its reference, and nothing else is registered."""
    expected = {}
    for reference, numpy_impl, numba_impl, cuda_impl in fast.TABLE:
        cpu = numba_impl if numba_impl is not None and fast.compiled.available() else numpy_impl
        for device, impl in (("cpu", cpu), ("cuda", cuda_impl)):
            if impl is not None:
                expected[(reference, device)] = impl
                if isinstance(reference, type):
                    assert issubclass(impl, reference) and impl.reference is reference
    expected[(dispatch.ENGINE, "any")] = fast.engine.ENGINE      # beside the table: one engine, every device
    assert isinstance(fast.engine.ENGINE, autograd.Engine)
    assert dispatch.registered() == expected
    x = Tensor(np.ones((2, 3)), requires_grad=True, dtype="float64")
    with fast.enabled():
        assert F.layer_norm(x, None, None).grad_fn.fn is expected[(LayerNorm, "cpu")]
        assert dispatch.lookup(dispatch.OPTIMIZER_STEP, "cpu") == expected[(dispatch.OPTIMIZER_STEP, "cpu")]
    with fast.disabled():
        assert F.layer_norm(x, None, None).grad_fn.fn is LayerNorm
        assert dispatch.lookup(dispatch.OPTIMIZER_STEP, "cpu") is None


# --------------------------------------------------------------------------- whole training steps
def randomised(model, seed=0):
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data[...] = p.data + 0.05 * rng.standard_normal(p.shape).astype(p.dtype)
    return model


def step_results(build, on):
    """Two training steps. SGD, not Adam: Adam divides by the gradient's size, so it turns the
    round-off of a gradient that is zero in exact arithmetic (a key bias) into a full step."""
    model = randomised(build())
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(3)
    images = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    labels = rng.integers(0, 5, 4)
    with (fast.enabled() if on else fast.disabled()):
        losses = []
        for _ in range(2):                      # two steps: the optimizer state is exercised too
            opt.zero_grad()
            loss = F.cross_entropy(model(Tensor(images)), labels)
            loss.backward()
            grads = {n: p.grad.copy() for n, p in model.named_parameters()}
            opt.step()
            losses.append(loss.item())
    return losses, grads, {n: p.data.copy() for n, p in model.named_parameters()}


SMALL = dict(image_size=16, patch_size=4, in_channels=3, num_classes=5, seed=1)
MODELS = {
    "mixer": lambda: MLPMixer(dim=24, depth=2, token_mlp_dim=12, channel_mlp_dim=48, **SMALL),
    "mixer, dropout": lambda: MLPMixer(dim=24, depth=2, token_mlp_dim=12, channel_mlp_dim=48, dropout=0.1, **SMALL),
    "gmlp": lambda: GMLP(dim=24, depth=2, ffn_dim=48, **SMALL),
    "gmlp, toeplitz 2d": lambda: GMLP(dim=24, depth=2, ffn_dim=48, toeplitz="2d", **SMALL),
    "amlp": lambda: AMLP(dim=24, depth=2, ffn_dim=48, attn_dim=8, **SMALL),
    "vit": lambda: tinymlp.models.ViT(dim=24, depth=2, heads=2, mlp_dim=48, **SMALL),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_step_is_the_same_with_the_fast_tier_on_and_off(name):
    (loss_f, grads_f, params_f), (loss_r, grads_r, params_r) = (step_results(MODELS[name], on) for on in (True, False))
    np.testing.assert_allclose(loss_f, loss_r, rtol=1e-5)
    scale = max(float(np.abs(g).max()) for g in grads_r.values())
    for n in grads_r:                           # float32: round-off relative to the largest gradient
        np.testing.assert_allclose(grads_f[n], grads_r[n], rtol=1e-3, atol=1e-5 * scale, err_msg=n)
        np.testing.assert_allclose(params_f[n], params_r[n], rtol=1e-4, atol=1e-5, err_msg=n)


def test_mixer_cifar_preset_step_agrees_and_shapes_are_b_s_c():
    model = randomised(create("mixer_cifar", depth=1))
    images = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    seen = []
    block = model.blocks[0]
    original = type(block).forward

    def spy(self, x):
        seen.append(x.shape)
        return original(self, x)

    type(block).forward = spy
    try:
        out = {}
        for on in (True, False):
            with (fast.enabled() if on else fast.disabled()):
                out[on] = model(Tensor(images)).numpy()
    finally:
        type(block).forward = original
    assert seen == [(2, 64, 256), (2, 64, 256)]          # what a student printing x sees
    np.testing.assert_allclose(out[True], out[False], rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- optimizers
OPTIMIZERS = [
    (SGD, dict(lr=0.1)), (SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (Adam, dict(lr=0.01, weight_decay=0.1)), (AdamW, dict(lr=0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("cls, kwargs", OPTIMIZERS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_flat_optimizer_equals_the_readable_one_and_tiers_switch_mid_training(cls, kwargs):
    rng = np.random.default_rng(0)
    shapes = [(70, 1000), (5,), (30, 30)]       # the first is larger than one CPU piece
    init = [rng.standard_normal(s) for s in shapes]
    history = []
    for step in range(5):
        grads = [rng.standard_normal(s) for s in shapes]
        if step == 1:
            grads[1] = None                     # parameters at different steps from here on
        history.append(grads)

    def train(tiers):
        params = [Tensor(a.copy(), requires_grad=True, dtype="float64") for a in init]
        opt = cls(params, **kwargs)
        for grads, on in zip(history, tiers):
            for p, g in zip(params, grads):
                p.grad = None if g is None else g.copy()
            with (fast.enabled() if on else fast.disabled()):
                opt.step()
        return [p.data for p in params], opt.state_dict()

    reference, state_ref = train([False] * 5)
    for tiers in ([True] * 5, [True, False, True, True, False]):
        got, state = train(tiers)
        for a, b in zip(got, reference):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
        assert sorted(state["state"]) == sorted(state_ref["state"])
        for k, entry in state_ref["state"].items():
            assert state["state"][k]["step"] == entry["step"]
            for name in entry:
                np.testing.assert_allclose(state["state"][k][name], entry[name], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- the switch
def test_disabled_runs_the_reference_and_restores_the_state():
    x = Tensor(np.ones((2, 3)), requires_grad=True, dtype="float64")
    w = Tensor(np.ones((3, 2)), requires_grad=True, dtype="float64")
    before = fast.is_enabled()
    with fast.disabled():
        assert F.linear(x, w).grad_fn.fn is Linear
        with fast.enabled():
            assert F.linear(x, w).grad_fn.fn is not Linear
        assert not fast.is_enabled()
    assert fast.is_enabled() == before


@pytest.mark.slow
def test_environment_variable_turns_the_fast_tier_off_at_import():
    """TINYMLP_FAST=0: the reference ops and the reference engine, end to end."""
    code = ("import tinymlp, tinymlp.functional as F, numpy as np;"
            "from tinymlp.ops.linear import Linear;"
            "x = tinymlp.tensor(np.ones((2, 3)), requires_grad=True);"
            "print(tinymlp.fast.is_enabled(), F.linear(x, x.T).grad_fn.fn is Linear,"
            "      tinymlp.autograd.engine() is tinymlp.autograd.REFERENCE)")
    for value, expected in (("0", "False True True"), ("1", "True False False")):
        env = {**os.environ, "TINYMLP_FAST": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == expected, (value, out.stdout, out.stderr)


def test_register_refuses_an_implementation_that_is_not_a_subclass():
    class NotALinear(tinymlp.Function):
        pass

    with pytest.raises(TypeError, match="must subclass Linear"):
        fast.register(Linear)(NotALinear)


# --------------------------------------------------------------------------- compiled kernels (numba)
# With numba installed (the "fast" extra) the CPU GELU and LayerNorm, the SGU's LayerNorm and the
# flat Adam/AdamW run compiled kernels; every op test above then checks them, and the tests here
# check their parallel path (large arrays), float32, and the NumPy fast path with numba off.
compiled = fast.compiled
needs_numba = pytest.mark.skipif(not compiled.available(), reason="numba not installed (pip install -e '.[fast]')")


@pytest.fixture
def numba_off():
    before = compiled.is_enabled()
    compiled.set_enabled(False)
    try:
        yield
    finally:
        compiled.set_enabled(before)


def test_without_numba_the_numpy_fast_path_runs_and_matches_the_reference(numba_off, monkeypatch):
    from tinymlp.fast.activation import FastGELU
    from tinymlp.fast.norm import FastLayerNorm

    assert issubclass(fast.implementation(GELU), FastGELU) and issubclass(fast.implementation(LayerNorm), FastLayerNorm)

    def no_kernel(pair, size):
        raise AssertionError("a numba kernel ran while the compiled kernels are switched off")

    monkeypatch.setattr(fast.compiled, "kernel", no_kernel)
    for test in (test_gelu, test_layer_norm, test_spatial_gating):   # the hypothesis tests, on the NumPy path
        test()
    test_gelu_in_chunks_keeps_the_layout()
    test_training_step_is_the_same_with_the_fast_tier_on_and_off("amlp")


@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.slow
def test_compiled_kernels_on_large_arrays_match_the_reference(dtype, layout):
    """Above PARALLEL_MIN elements the parallel kernels run; float32 arrays take the float32 kernels."""
    from tinymlp.fast.activation import CompiledGELU
    from tinymlp.fast.norm import CompiledLayerNorm

    assert compiled.is_enabled() and fast.implementation(GELU) is CompiledGELU
    rng = np.random.default_rng(0)
    x = (3 * laid_out(rng, (32, 64, 160), layout)).astype(dtype)
    assert x.size >= compiled.PARALLEL_MIN
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=2e-4, atol=2e-5)
    results = run_both(F.gelu, [x], expect=GELU)
    assert_same(results, what=f"gelu {layout}", **tol)
    assert results[0][0].dtype == np.dtype(dtype)
    w, b = rng.standard_normal(160).astype(dtype), rng.standard_normal(160).astype(dtype)
    expect = LayerNorm if layout != "token-major swapped" else None   # rows not contiguous: the NumPy path
    results = run_both(lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5), [x + 1, w, b], expect=expect)
    assert_same(results, what=f"layer_norm {layout}", **tol)
    if layout != "token-major swapped":
        assert fast.implementation(LayerNorm) is CompiledLayerNorm
    with fast.enabled():   # outputs laid out like the input
        xt = Tensor(x, dtype=dtype)
        for y in (F.gelu(xt), F.layer_norm(xt, Tensor(w, dtype=dtype), Tensor(b, dtype=dtype))):
            assert y.dtype == np.dtype(dtype)
            assert y.data.transpose(fast.layout.memory_order(x)).flags.c_contiguous


@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.slow
def test_compiled_sgu_layer_norm_on_large_arrays_matches_the_reference(dtype):
    rng = np.random.default_rng(1)
    B, S, e = 48, 64, 96
    z = laid_out(rng, (B, S, 2 * e), "token-major").astype(dtype)
    arrays = [z, rng.standard_normal((S, S)).astype(dtype), rng.standard_normal(S).astype(dtype),
              rng.standard_normal(e).astype(dtype), rng.standard_normal(e).astype(dtype)]
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=2e-3, atol=2e-5)
    assert_same(run_both(lambda *a: F.spatial_gating(*a, eps=1e-5), arrays, expect=SpatialGating), **tol)


@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("residual_layout", [None, "C", "token-major"])
def test_compiled_sgu_gate_on_large_arrays_matches_the_reference_and_runs(dtype, residual_layout, monkeypatch):
    """The split gate's kernels (F, z1 * F; G * F, G * z1, the bias's sums; N) on the layouts the
    models give them: z token-major, aMLP's residual in C order (the attention's output) or not."""
    from tinymlp.fast.gating import CompiledSpatialGating
    from tinymlp.fast.kernels import gating_numba

    rng = np.random.default_rng(2)
    B, S, e = 48, 64, 96
    z = laid_out(rng, (B, S, 2 * e), "token-major").astype(dtype)
    arrays = [z, rng.standard_normal((S, S)).astype(dtype), rng.standard_normal(S).astype(dtype),
              rng.standard_normal(e).astype(dtype), rng.standard_normal(e).astype(dtype)]
    arrays.append(None if residual_layout is None else laid_out(rng, (B, S, e), residual_layout).astype(dtype))
    ran = []

    def counting(name, kernel):
        def run(*a, **kw):
            out = kernel(*a, **kw)
            ran.append((name, out is not None))
            return out
        return run

    assert fast.implementation(SpatialGating) is CompiledSpatialGating
    for name in ("gate_forward", "_gate_backward_run"):          # what the from-z passes launch
        monkeypatch.setattr(gating_numba, name, counting(name, getattr(gating_numba, name)))
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == "float64" else dict(rtol=2e-3, atol=2e-5)
    gate = lambda z, w, b, g, be, r: F.spatial_gating(z, w, b, g, be, eps=1e-5, gate_residual=r)  # noqa: E731
    assert_same(run_both(gate, arrays, expect=SpatialGating), **tol)
    assert {name for name, _ in ran} == {"gate_forward", "_gate_backward_run"} and all(done for _, done in ran)


@needs_numba
@pytest.mark.parametrize("residual", [False, True])
def test_compiled_split_sgu_keeps_z_and_the_product_and_copies_nothing(residual):
    """On token-major z the compiled split SGU saves z itself (z1 and the LayerNorm's input are its
    halves) and W x_hat (F, with aMLP's residual): no copy of z1, no x_hat, no residual kept."""
    from tinymlp.fast.gating import CompiledSpatialGating

    rng = np.random.default_rng(3)
    B, S, e = 8, 16, 32
    z = Tensor(laid_out(rng, (B, S, 2 * e), "token-major"), requires_grad=True)
    params = [Tensor(a, requires_grad=True) for a in (rng.standard_normal((S, S)), rng.standard_normal(S),
                                                       rng.standard_normal(e), rng.standard_normal(e))]
    a = Tensor(laid_out(rng, (B, S, e), "C"), requires_grad=True) if residual else None
    assert fast.implementation(SpatialGating) is CompiledSpatialGating
    out = F.spatial_gating(z, *params, gate_residual=a)
    big = [x for x in out.grad_fn.saved_tensors if x is not None and x.size >= B * S * e]
    assert len(big) == 2
    assert big[0].shape == (S, B, 2 * e) and np.shares_memory(big[0], z.data)      # z, token-major
    assert big[1].shape == (S, B, e) and not np.shares_memory(big[1], z.data)      # W x_hat, or F
    if residual:
        assert not any(np.shares_memory(x, a.data) for x in big)


@needs_numba
@pytest.mark.parametrize("cls", [Adam, AdamW])
@pytest.mark.slow
def test_compiled_adam_equals_the_readable_one_in_float32_and_on_large_buffers(cls):
    rng = np.random.default_rng(0)
    shapes = [(600, 500), (7,), (30, 30)]       # more than PARALLEL_MIN values in all
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]

    def train(on):
        params = [Tensor(a.copy(), requires_grad=True) for a in init]
        opt = cls(params, lr=0.01, weight_decay=0.1)
        for gs in grads:
            for p, g in zip(params, gs):
                p.grad = g.copy()
            with (fast.enabled() if on else fast.disabled()):
                opt.step()
        return [p.data for p in params]

    for a, b in zip(train(True), train(False)):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_numba_switches_and_says_what_runs():
    code = "import tinymlp.fast as f; print(f.compiled.is_enabled()); print(f.compiled.describe())"
    env = {**os.environ, "TINYMLP_NUMBA": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    enabled, line = out.stdout.strip().splitlines()
    assert enabled == "False"
    assert ("TINYMLP_NUMBA=0" in line) if compiled.available() else ("not installed" in line)
    assert "NumPy fast path" in line
    assert isinstance(fast.memory.describe(), str)


# --------------------------------------------------------------------------- CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("layout", ["C", "token-major"])
def test_fast_ops_on_the_gpu_match_the_reference(layout):
    rng = np.random.default_rng(0)
    z = laid_out(rng, (2, 4, 6), layout, device="cuda")
    w = to_device(rng.standard_normal((4, 4)), "cuda")
    vecs = [to_device(v, "cuda") for v in (rng.standard_normal(4), rng.standard_normal(3), rng.standard_normal(3))]
    assert_same(run_both(lambda z, w, b, g, be: F.spatial_gating(z, w, b, g, be), [z, w, *vecs], device="cuda",
                         expect=SpatialGating), rtol=1e-9)
    x = laid_out(rng, (2, 4, 6), layout, device="cuda")
    assert_same(run_both(F.gelu, [x], device="cuda", expect=GELU), rtol=1e-9)
    gamma, beta = (to_device(v, "cuda") for v in (rng.standard_normal(6), rng.standard_normal(6)))
    assert_same(run_both(lambda x, g, b: F.layer_norm(x, g, b), [x, gamma, beta], device="cuda",
                         expect=LayerNorm), rtol=1e-9)
    wl = to_device(rng.standard_normal((6, 5)), "cuda")
    assert_same(run_both(lambda x, w: F.linear(x, w), [x, wl], device="cuda", expect=Linear), rtol=1e-9)
    assert_same(run_both(lambda x: F.softmax(x), [x], device="cuda", expect=Softmax), rtol=1e-9)
