"""GPU tests (CuPy): fused kernels against their references, gradients on the device, CPU/GPU parity.

Every test here carries the ``cuda`` marker (``pytestmark``) and is skipped by conftest where
CuPy sees no GPU; the module itself imports without CuPy. What is checked, against what:

- each kernel of ``tinymlp/fast/kernels/*_cuda.py`` against the generic formula of its op run by
  NumPy in float64 on the same inputs (float32 and float64; widths 1, 33, 257; one token;
  batch one; strided views of the SGU's halves);
- every ``F`` op's backward against finite differences (``tinymlp.gradcheck``) on CuPy
  arrays in float64;
- a whole tiny MLPMixer, gMLP and aMLP: same weights and images on both devices give the same
  loss and gradients; a short training run on the GPU follows the CPU run;
- the DataLoader on ``device="cuda"`` and ``python -m tinymlp doctor``.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp import gradcheck, tensor
from tinymlp.backend import to_device
from tinymlp.fast import activation
from tinymlp.fast.kernels import activation_cuda, attention_cuda, gating_cuda, norm_cuda, optim_cuda
from tinymlp.ops import norm

pytestmark = pytest.mark.cuda

DTYPES = [np.float32, np.float64]
WIDTHS = [1, 33, 257]          # one column, just past a warp, just past a 256-thread block
LEADS = [(1,), (1, 1), (2, 3), (5,)]   # one row, one token of batch one, (batch, tokens), rows


@pytest.fixture
def cp():
    return tinymlp.backend.get_cupy("cuda")


def gpu(a, dtype=None):
    a = np.asarray(a, dtype=dtype) if dtype is not None else np.asarray(a)
    return to_device(np.ascontiguousarray(a), "cuda")


def host(a):
    return to_device(a, "cpu")


def assert_close(got, ref, dtype, what=""):
    """Kernel output (CuPy) against a float64 NumPy reference computed from the same inputs.

    float64: both sides are the same formula up to summation order: 1e-10 relative.
    float32: unit roundoff 6e-8; a row sum of up to 257 terms in another order (block tree vs
    NumPy's pairwise) moves the result by at most ~257 * 6e-8 = 1.5e-5 of the row's scale, so
    5e-5 of the largest reference value (and 1e-4 relative) is a bound, not a guess.
    """
    got = host(got).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    scale = max(1.0, float(np.abs(ref).max(initial=0.0)))
    if np.dtype(dtype) == np.float64:
        np.testing.assert_allclose(got, ref, rtol=1e-10, atol=1e-12 * scale, err_msg=what)
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=5e-5 * scale, err_msg=what)


def draw(rng, shape, dtype, loc=0.0, scale=1.0):
    """Random values already rounded to ``dtype`` (so both sides start from the same numbers)."""
    return (loc + scale * rng.standard_normal(shape)).astype(dtype)


# ============================================================================ fused kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (33,), (3, 257), (2, 1, 33)])
def test_gelu_kernel_matches_generic_formula(cp, dtype, shape):
    x = draw(np.random.default_rng(0), shape, dtype, scale=3.0)
    y_ref, d_ref = np.empty(shape), np.empty(shape)
    activation.gelu_tanh_into(x.astype(np.float64), y_ref, d_ref)     # the generic xp code, on NumPy
    y, d = activation_cuda.gelu_tanh_forward(gpu(x))
    assert y.dtype == dtype and d.dtype == dtype
    assert_close(y, y_ref, dtype, "gelu y")
    assert_close(d, d_ref, dtype, "gelu dy/dx")
    y_only, none = activation_cuda.gelu_tanh_forward(gpu(x), want_derivative=False)
    assert none is None
    assert_close(y_only, y_ref, dtype, "gelu y (no derivative)")
    g = draw(np.random.default_rng(1), shape, dtype)
    assert_close(activation_cuda.gelu_backward(gpu(g), d), g * d_ref, dtype, "gelu backward")


def test_gelu_kernel_on_a_strided_view(cp):
    x = draw(np.random.default_rng(2), (4, 66), np.float64, scale=3.0)
    y_ref, d_ref = np.empty((4, 33)), np.empty((4, 33))
    activation.gelu_tanh_into(x[:, ::2], y_ref, d_ref)
    y, d = activation_cuda.gelu_tanh_forward(gpu(x)[:, ::2])
    assert_close(y, y_ref, np.float64, "gelu y (view)")
    assert_close(d, d_ref, np.float64, "gelu dy/dx (view)")


def layer_norm_reference(x, weight, bias, g, eps):
    """The CPU op (norm.py) in float64: y, and the gradients for upstream g; plus xhat, rstd."""
    xt = tensor(x, dtype="float64", requires_grad=True)
    wt = tensor(weight, dtype="float64", requires_grad=True)
    bt = tensor(bias, dtype="float64", requires_grad=True)
    y = F.layer_norm(xt, wt, bt, eps=eps)
    y.backward(g.astype(np.float64))
    xhat, rstd = norm.normalize(x.astype(np.float64), eps)   # the generic statistics
    return y.numpy(), xhat, rstd[..., 0], xt.grad, wt.grad, bt.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("lead", LEADS)
def test_layer_norm_kernels_match_the_op(cp, dtype, width, lead):
    rng = np.random.default_rng(width)
    shape, eps = (*lead, width), 1e-6
    x = draw(rng, shape, dtype, loc=2.0, scale=3.0)   # an offset: the mean must really be removed
    w, b, g = draw(rng, (width,), dtype), draw(rng, (width,), dtype), draw(rng, shape, dtype)
    y_ref, xhat_ref, rstd_ref, dx_ref, dw_ref, db_ref = layer_norm_reference(x, w, b, g, eps)

    y, xhat, rstd = norm_cuda.layer_norm_forward(gpu(x), gpu(w), gpu(b), eps)
    assert y.shape == shape and xhat.shape == shape and rstd.shape == lead
    assert {y.dtype, xhat.dtype, rstd.dtype} == {np.dtype(dtype)}
    assert_close(y, y_ref, dtype, "layer_norm y")
    assert_close(xhat, xhat_ref, dtype, "layer_norm xhat")
    assert_close(rstd, rstd_ref, dtype, "layer_norm rstd")

    dx, dw, db = norm_cuda.layer_norm_backward(gpu(g), xhat, rstd, gpu(w))
    assert_close(dx, dx_ref, dtype, "layer_norm dx")
    assert_close(dw, dw_ref, dtype, "layer_norm dweight")
    assert_close(db, db_ref, dtype, "layer_norm dbias")

    xhat2, rstd2 = norm_cuda.layer_norm_normalize(gpu(x), eps)
    assert_close(xhat2, xhat_ref, dtype, "layer_norm_normalize xhat")
    assert (host(rstd2) == host(rstd)).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", [(1, 1), (31, 33), (8192, 256), (10_007, 257), (40_000, 1)])
def test_layer_norm_parameter_gradients_over_many_rows(cp, dtype, rows, width):
    """dweight, dbias: column sums over every row, in chunks (a partial last chunk included).

    Each column is a sum of ``rows`` terms, added in chunks of at most a few hundred and then
    chunk by chunk; in float32 the error is then at most about (chunk + chunks) * 6e-8 of the
    sum of the terms' sizes: 3e-5 of it is a bound.
    """
    rng = np.random.default_rng(rows + width)
    g, xhat = draw(rng, (rows, width), dtype), draw(rng, (rows, width), dtype)
    dw, db = norm_cuda.layer_norm_param_grads(gpu(g), gpu(xhat))
    g64, h64 = g.astype(np.float64), xhat.astype(np.float64)
    rel = 1e-12 if np.dtype(dtype) == np.float64 else 3e-5
    for got, terms, what in ((dw, g64 * h64, "dweight"), (db, g64, "dbias")):
        assert got.shape == (width,) and got.dtype == np.dtype(dtype)
        err = np.abs(host(got).astype(np.float64) - terms.sum(axis=0))
        bound = rel * np.abs(terms).sum(axis=0) + 1e-30
        assert (err <= bound).all(), f"{what}: worst error {(err / bound).max():.2f} x the bound"


def test_layer_norm_kernels_without_weight_and_bias(cp):
    rng = np.random.default_rng(3)
    x, g = draw(rng, (4, 33), np.float64), draw(rng, (4, 33), np.float64)
    ones, zeros = np.ones(33), np.zeros(33)
    y_ref, _, _, dx_ref, _, _ = layer_norm_reference(x, ones, zeros, g, 1e-5)
    y, xhat, rstd = norm_cuda.layer_norm_forward(gpu(x), None, None, 1e-5)
    assert_close(y, y_ref, np.float64, "y")
    dx, _, _ = norm_cuda.layer_norm_backward(gpu(g), xhat, rstd, None, need_dweight=False, need_dbias=False)
    assert_close(dx, dx_ref, np.float64, "dx")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,S,e", [(1, 1, 1), (2, 5, 33), (1, 3, 257)])
def test_layer_norm_kernels_read_and_write_strided_halves(cp, dtype, B, S, e):
    """The SGU normalises z[..., e:] in place and writes dL/dz2 into dz[..., e:]."""
    rng = np.random.default_rng(e)
    z = draw(rng, (B, S, 2 * e), dtype, loc=1.0, scale=2.0)
    gamma, gn = draw(rng, (e,), dtype), draw(rng, (B, S, e), dtype)
    _, xhat_ref, _, dx_ref, dw_ref, db_ref = layer_norm_reference(z[..., e:], gamma, np.zeros(e), gn, 1e-5)

    zg = gpu(z)
    xhat, rstd = norm_cuda.layer_norm_normalize(zg[..., e:], 1e-5)
    assert_close(xhat, xhat_ref, dtype, "xhat of the second half")
    dz = cp.full((B, S, 2 * e), 7.0, dtype=dtype)
    dz2 = dz[..., e:]
    dx, dw, db = norm_cuda.layer_norm_backward(gpu(gn), xhat, rstd, gpu(gamma), out=dz2)
    assert dx is dz2
    assert_close(dz[..., e:], dx_ref, dtype, "dx written into the second half")
    assert (host(dz[..., :e]) == 7.0).all(), "the first half was overwritten"
    assert_close(dw, dw_ref, dtype, "dgamma")
    assert_close(db, db_ref, dtype, "dbeta")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("lead", LEADS)
def test_softmax_backward_kernel_matches_formula(cp, dtype, width, lead):
    rng = np.random.default_rng(width + 1)
    shape = (*lead, width)
    logits = rng.standard_normal(shape) * 3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = (p / p.sum(-1, keepdims=True)).astype(dtype)
    g = draw(rng, shape, dtype)
    p64, g64 = p.astype(np.float64), g.astype(np.float64)
    ref = p64 * (g64 - (g64 * p64).sum(-1, keepdims=True))       # Softmax.backward in attention.py
    assert_close(attention_cuda.softmax_backward(gpu(p), gpu(g)), ref, dtype, "softmax backward")
    gg = gpu(g)
    out = attention_cuda.softmax_backward(gpu(p), gg, out=gg)      # in place, as Attention.backward does
    assert out is gg
    assert_close(gg, ref, dtype, "softmax backward in place")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("B,S,e", [(1, 1, 1), (2, 5, 33), (1, 4, 257)])
def test_sgu_gate_kernels_match_formula(cp, dtype, residual, B, S, e):
    rng = np.random.default_rng(S * e)
    z = draw(rng, (B, S, 2 * e), dtype)
    f0, gamma, shift = draw(rng, (B, S, e), dtype), draw(rng, (e,), dtype), draw(rng, (S, e), dtype)
    a = draw(rng, (B, S, e), dtype) if residual else None
    g = draw(rng, (B, S, e), dtype)
    z64 = z.astype(np.float64)
    f_ref = f0.astype(np.float64) * gamma + shift + (a if residual else 0.0)
    out_ref = z64[..., :e] * f_ref

    zg, f = gpu(z), gpu(f0)
    out = gating_cuda.sgu_gate_forward(f, gpu(gamma), gpu(shift), zg[..., :e], gpu(a) if residual else None)
    assert_close(f, f_ref, dtype, "F (in place)")
    assert_close(out, out_ref, dtype, "z1 * F")

    dz = cp.full((B, S, 2 * e), 7.0, dtype=dtype)
    _, gf = gating_cuda.sgu_gate_backward(gpu(g), f, zg[..., :e], dz1=dz[..., :e])
    assert_close(dz[..., :e], g * f_ref, dtype, "dz1 = G * F")
    assert_close(gf, g * z64[..., :e], dtype, "G_F = G * z1")
    assert (host(dz[..., e:]) == 7.0).all(), "the second half was overwritten"


def test_kernels_refuse_other_dtypes(cp):
    with pytest.raises(TypeError, match="float32 or float64"):
        activation_cuda.gelu_tanh_forward(cp.zeros(3, dtype=cp.float16))
    with pytest.raises(TypeError, match="one dtype"):
        attention_cuda.softmax_backward(cp.zeros(3, dtype=cp.float32), cp.zeros(3, dtype=cp.float64))


# ============================================================================ gradchecks on the GPU
def leaf(rng, shape, scale=1.0):
    return tensor(scale * rng.standard_normal(shape), requires_grad=True, dtype="float64", device="cuda")


def gradcheck_cases():
    """name -> builder(rng) returning (fn, inputs): one entry per F op and option."""
    cases = {
        "linear": lambda r: (F.linear, (leaf(r, (2, 3, 5)), leaf(r, (5, 33)), leaf(r, (33,)))),
        "gelu_tanh": lambda r: (F.gelu, (leaf(r, (3, 33), 2.0),)),
        "gelu_erf": lambda r: (lambda x: F.gelu(x, approximate=False), (leaf(r, (3, 33), 2.0),)),
        "relu": lambda r: (F.relu, (leaf(r, (4, 7)),)),
        "sigmoid": lambda r: (F.sigmoid, (leaf(r, (4, 7)),)),
        "tanh": lambda r: (F.tanh, (leaf(r, (4, 7)),)),
        "layer_norm": lambda r: (lambda x, w, b: F.layer_norm(x, w, b, eps=1e-5),
                                 (leaf(r, (2, 3, 33)), leaf(r, (33,)), leaf(r, (33,)))),
        "layer_norm_width1": lambda r: (F.layer_norm, (leaf(r, (3, 1)), leaf(r, (1,)), leaf(r, (1,)))),
        "softmax": lambda r: (F.softmax, (leaf(r, (2, 3, 33), 2.0),)),
        "softmax_axis0": lambda r: (lambda x: F.softmax(x, axis=0), (leaf(r, (5, 3)),)),
        "log_softmax": lambda r: (F.log_softmax, (leaf(r, (4, 10), 2.0),)),
        "attention": lambda r: (F.attention, (leaf(r, (2, 5, 4)), leaf(r, (2, 6, 4)), leaf(r, (2, 6, 3)))),
        "attention_causal": lambda r: (lambda q, k, v: F.attention(q, k, v, causal=True),
                                       (leaf(r, (1, 5, 4)), leaf(r, (1, 5, 4)), leaf(r, (1, 5, 3)))),
        "attention_mask": lambda r: (
            lambda q, k, v: F.attention(q, k, v, mask=np.random.default_rng(0).random((5, 6)) < 0.6),
            (leaf(r, (2, 5, 4)), leaf(r, (2, 6, 4)), leaf(r, (2, 6, 3)))),
        "cross_entropy": lambda r: (lambda x: F.cross_entropy(x, np.array([0, 3, 1, 9])), (leaf(r, (4, 10)),)),
        "cross_entropy_soft_smoothed": lambda r: (
            lambda x: F.cross_entropy(x, np.random.default_rng(1).dirichlet(np.ones(10), 4), label_smoothing=0.1),
            (leaf(r, (4, 10)),)),
        "dropout": lambda r: (lambda x: F.dropout(x, 0.3, rng=np.random.default_rng(0)), (leaf(r, (4, 7)),)),
        "toeplitz_1d": lambda r: (lambda w: F.toeplitz_1d(w, 4), (leaf(r, (7,)),)),
        "toeplitz_2d": lambda r: (lambda w: F.toeplitz_2d(w, 2, 3), (leaf(r, (3, 5)),)),
    }
    for variant in ("split", "linear", "additive", "multiplicative"):
        for residual in (False, True):
            for causal in (False, True):
                name = f"spatial_gating_{variant}{'_residual' if residual else ''}{'_causal' if causal else ''}"
                cases[name] = _sgu_case(variant, residual, causal)
    return cases


def _sgu_case(variant, residual, causal):
    def build(r):
        B, S, e = 2, 4, 3
        width = 2 * e if variant == "split" else e
        inputs = (leaf(r, (B, S, width)), leaf(r, (S, S)), leaf(r, (S,)), leaf(r, (e,)), leaf(r, (e,)),
                  leaf(r, (B, S, e)) if residual else None)

        def fn(z, w, b, gamma, beta, a):
            return F.spatial_gating(z, w, b, gamma, beta, eps=1e-5, gate_residual=a, causal=causal, variant=variant)

        return fn, inputs
    return build


CASES = gradcheck_cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_on_the_gpu(name):
    fn, inputs = CASES[name](np.random.default_rng(0))
    report = gradcheck(fn, inputs)            # float64 on CuPy arrays; raises with the report
    assert report.passed


# ============================================================================ CPU / GPU parity
TINY = dict(image_size=8, patch_size=2, in_channels=3, num_classes=5, seed=3)   # 16 tokens


def tiny_model(kind):
    from tinymlp.models import AMLP, GMLP, MLPMixer

    if kind == "mixer":
        return MLPMixer(dim=33, depth=2, token_mlp_dim=7, channel_mlp_dim=40, **TINY)
    if kind == "gmlp":
        return GMLP(dim=33, depth=2, ffn_dim=66, **TINY)
    return AMLP(dim=33, depth=2, ffn_dim=66, attn_dim=8, **TINY)


def randomise(model, seed=0):
    """Non-trivial weights everywhere (the zero head and unit norms would hide errors)."""
    rng = np.random.default_rng(seed)
    state = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    return model


def loss_and_grads(model, images, labels):
    model.zero_grad()
    loss = F.cross_entropy(model(tensor(images, dtype=model_dtype(model), device=device_of(model))), labels)
    loss.backward()
    grads = {name: host(p.grad) if p.grad is not None else np.zeros(p.shape)
             for name, p in model.named_parameters()}
    return float(loss.item()), grads


def model_dtype(model):
    return next(model.parameters()).dtype


def device_of(model):
    return next(model.parameters()).device


@pytest.mark.parametrize("kind", ["mixer", "gmlp", "amlp"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_whole_model_matches_cpu(kind, dtype):
    rng = np.random.default_rng(1)
    images = rng.random((3, 3, 8, 8))
    labels = np.array([0, 4, 2])
    cpu = randomise(tiny_model(kind)).to(dtype=dtype)
    cuda = randomise(tiny_model(kind)).to(device="cuda", dtype=dtype)
    loss_cpu, grads_cpu = loss_and_grads(cpu, images, labels)
    loss_gpu, grads_gpu = loss_and_grads(cuda, images, to_device(labels, "cuda"))
    # float64: the same math in another summation order (cuBLAS, block reductions): ~1e-15,
    # 1e-10 leaves room for depth. float32: unit roundoff 6e-8 times sums of <= 66 terms per
    # layer through 2 blocks gives ~1e-5 relative at worst; 1e-4 (loss 1e-5) is still 1000x
    # smaller than any real bug (a wrong factor, a missing term). CuPy uses no TF32 unless
    # CUPY_TF32=1 is set, which these tolerances would not cover.
    rtol_loss, rtol_grad = (1e-10, 1e-10) if dtype == np.float64 else (1e-5, 1e-4)
    assert abs(loss_gpu - loss_cpu) <= rtol_loss * abs(loss_cpu)
    assert grads_cpu.keys() == grads_gpu.keys()
    # normwise, relative to the largest gradient of the tensor, or of the whole model for
    # token_mlp.fc2.bias, whose gradient is zero in exact arithmetic (see mixer.py)
    overall = max(np.abs(g).max() for g in grads_cpu.values())
    for name in grads_cpu:
        ref, got = grads_cpu[name].astype(np.float64), grads_gpu[name].astype(np.float64)
        assert got.shape == ref.shape
        scale = overall if name.endswith("token_mlp.fc2.bias") else max(np.abs(ref).max(), 1e-300)
        err = np.abs(got - ref).max() / scale
        assert err <= rtol_grad, f"{kind} {np.dtype(dtype).name}: {name} differs by {err:.2e} (relative)"


def train_losses(device, steps=12):
    """Losses of a small CIFAR-shaped Mixer memorising one batch of 64 synthetic images
    (AdamW, float32): the classic smoke test that a model, its gradients and the optimizer work."""
    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.models import MLPMixer
    from tinymlp.optim import AdamW

    model = MLPMixer(image_size=32, patch_size=4, in_channels=3, num_classes=10, dim=32, depth=2,
                     token_mlp_dim=16, channel_mlp_dim=64, seed=0).to(device=device)
    optimizer = AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    x, y = next(iter(DataLoader(SyntheticImages(num_images=64, seed=0), batch_size=64, device=device)))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


def test_short_training_run_follows_the_cpu():
    cpu, gpu_losses = train_losses("cpu"), train_losses("cuda")
    assert gpu_losses[-1] < 0.6 * gpu_losses[0], f"the loss did not go down on the GPU: {gpu_losses}"
    assert cpu[-1] < 0.6 * cpu[0]           # on this machine: 2.30 -> 0.86 in 12 steps
    # float32 rounding differs between the devices (summation orders) and Adam divides each
    # gradient by its own running scale, which magnifies the noise in gradients that are zero
    # in exact arithmetic (a bias that a LayerNorm removes: it cannot change the loss). Over 12
    # steps the curves agree far better than 2%; a real bug (a wrong step, a missed gradient)
    # changes the curve from the first step on by much more.
    np.testing.assert_allclose(gpu_losses, cpu, rtol=2e-2)


# ============================================================================ data and doctor
def test_data_loader_on_cuda_yields_cupy_arrays_equal_to_cpu(cp):
    from tinymlp.data import Compose, DataLoader, HorizontalFlip, Normalize, RandomCrop, SyntheticImages

    data = SyntheticImages(num_images=20, seed=0)

    def loader(device):
        augment = Compose([RandomCrop(4), HorizontalFlip(), Normalize(data.mean, data.std)])
        return DataLoader(data, batch_size=8, shuffle=True, rng=5, transform=augment, device=device)

    batches = list(zip(loader("cpu"), loader("cuda")))
    assert len(batches) == 3
    for (xc, yc), (xg, yg) in batches:
        assert isinstance(xg.data, cp.ndarray) and isinstance(yg.data, cp.ndarray)
        assert xg.device == "cuda" and xg.dtype == np.float32 and yg.dtype == np.int64
        assert xg.shape == xc.shape
        np.testing.assert_allclose(xg.numpy(), xc.numpy(), rtol=1e-6, atol=1e-6)
        assert (yg.numpy() == yc.numpy()).all()


def test_doctor_runs_an_op_on_the_gpu(capsys):
    from tinymlp.__main__ import doctor

    assert doctor() == 0
    out = capsys.readouterr().out
    assert "cupy" in out and "cuda    runtime" in out
    assert "tiny op: ok" in out.split("cuda    runtime", 1)[1]


# ============================================================================ no host sync, the headline command
def test_fit_runs_inside_allow_synchronize_false_but_for_the_epochs_metrics(cp, monkeypatch):
    """A few steps of fit() (loader, crop, flip, normalize, clip, AdamW, schedule) with CuPy
    refusing every device-to-host synchronisation, except the end-of-epoch read of the metrics."""
    import cupyx

    from tinymlp import train
    from tinymlp.data import Compose, DataLoader, HorizontalFlip, Normalize, RandomCrop, SyntheticImages

    data = SyntheticImages(num_images=64, seed=0)
    augment = Compose([RandomCrop(4), HorizontalFlip(), Normalize(data.mean, data.std)])
    loader = DataLoader(data, batch_size=16, shuffle=True, rng=0, transform=augment, device="cuda")
    model = tinymlp.models.create("mixer_cifar", depth=2, dim=32, token_mlp_dim=16, channel_mlp_dim=64,
                                  seed=0).to("cuda")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    schedule = tinymlp.optim.WarmupCosine(optimizer, warmup_steps=2, total_steps=4)
    next(iter(loader))                           # compile the loader's kernels outside the check
    reads, read = [], train._to_host

    def allowed_read(*scalars):
        reads.append(len(scalars))
        with cupyx.allow_synchronize(True):
            return read(*scalars)

    monkeypatch.setattr(train, "_to_host", allowed_read)
    with cupyx.allow_synchronize(False):
        history = train.fit(model, optimizer, loader, epochs=1, scheduler=schedule, clip=1.0, progress=False,
                            sync_every=10_000)
    assert reads == [2] and history.steps == [4] and np.isfinite(history.train_loss[0])


def test_the_headline_command_trains_one_synthetic_epoch_on_the_gpu(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).parents[1]
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(root / "examples" / "train_cifar_mixer.py"), "--device", "cuda",
                           "--dataset", "synthetic", "--synthetic-size", "512", "--epochs", "1", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for name in ("checkpoint.npz", "metrics.json", "curves.png", "token_mixing.png"):
        assert (out / name).stat().st_size > 0, name
    metrics = json.loads((out / "metrics.json").read_text())
    assert json.dumps(metrics).count("images_per_sec") >= 1


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_kernels_keep_a_token_major_layout(cp, dtype):
    rng = np.random.default_rng(0)
    host = rng.standard_normal((3, 5, 33)).astype(dtype)
    x = cp.ascontiguousarray(cp.asarray(host).transpose(1, 0, 2)).transpose(1, 0, 2)   # token-major (B, S, C)
    w, b = gpu(rng.random(33), dtype), gpu(rng.random(33), dtype)
    y, xhat, rstd = norm_cuda.layer_norm_forward(x, w, b, 1e-5)
    assert y.transpose(1, 0, 2).flags.c_contiguous and xhat.transpose(1, 0, 2).flags.c_contiguous
    mean, var = host.mean(-1, keepdims=True), host.var(-1, keepdims=True)
    expected = (host - mean) / np.sqrt(var + 1e-5) * to_device(w, "cpu") + to_device(b, "cpu")
    assert_close(y, expected, dtype, "token-major LayerNorm")
    g = cp.ascontiguousarray(
        cp.asarray(rng.standard_normal(host.shape).astype(dtype)).transpose(1, 0, 2)).transpose(1, 0, 2)
    dx, _, _ = norm_cuda.layer_norm_backward(g, xhat, rstd, w)
    assert dx.transpose(1, 0, 2).flags.c_contiguous
    gw = to_device(g, "cpu") * to_device(w, "cpu")
    xh = (host - mean) / np.sqrt(var + 1e-5)
    assert_close(dx, (gw - gw.mean(-1, keepdims=True) - xh * (gw * xh).mean(-1, keepdims=True))
                 / np.sqrt(var + 1e-5), dtype, "token-major LayerNorm backward")


def test_sgu_gate_kernel_writes_into_a_strided_out(cp):
    rng = np.random.default_rng(0)
    f, z1 = (rng.standard_normal((2, 4, 6)).astype(np.float32) for _ in range(2))
    gamma, shift = rng.random(6).astype(np.float32), rng.random((4, 6)).astype(np.float32)
    out = cp.zeros((4, 2, 6), dtype=np.float32).transpose(1, 0, 2)           # (B, S, e) token-major
    got = gating_cuda.sgu_gate_forward(gpu(f), gpu(gamma), gpu(shift), gpu(z1), out=out)
    assert got is out
    assert_close(out, z1 * (f * gamma + shift), np.float32, "sgu gate into out")


def _adam_run(cp, dtype, fused, monkeypatch, decoupled):
    """Three steps of Adam(W) on the GPU over parameters of odd sizes, fused or array code."""
    rng = np.random.default_rng(0)
    shapes = [(33, 7), (1,), (257,), (3, 1, 5)]
    params = [tensor(rng.standard_normal(s), dtype=dtype, device="cuda", requires_grad=True) for s in shapes]
    cls = tinymlp.optim.AdamW if decoupled else tinymlp.optim.Adam
    opt = cls(params, lr=0.05, weight_decay=0.1)
    with monkeypatch.context() as m:
        if not fused:
            m.setattr(optim_cuda, "multi_tensor_ok", lambda arrays: False)
        for _ in range(3):
            for p in params:
                p.grad = gpu(rng.standard_normal(p.shape), dtype)
            opt.step()
    return [host(p.data) for p in params]


@pytest.mark.parametrize("decoupled", [True, False], ids=["AdamW", "Adam-L2"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_fused_adam_step_follows_the_array_code(cp, dtype, decoupled, monkeypatch):
    """One kernel for the whole step, compiled without FMA contraction and in the array code's
    operation order: the flat array code's numbers after three steps, to a few units of
    rounding (each operation is IEEE-rounded on both sides)."""
    fused = _adam_run(cp, dtype, True, monkeypatch, decoupled)
    plain = _adam_run(cp, dtype, False, monkeypatch, decoupled)
    rtol = 1e-14 if np.dtype(dtype) == np.float64 else 1e-6
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_clipping_matches_the_per_gradient_code(cp, dtype):
    rng = np.random.default_rng(2)
    host_grads = [rng.standard_normal(s).astype(dtype) for s in [(300, 7), (1,), (4099,)]]
    norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in host_grads)))
    for max_norm, sync in ((norm / 3, False), (norm / 3, True), (norm * 2, False)):
        results = {}
        for tier in ("fast", "reference"):
            params = [tensor(np.zeros(g.shape), dtype=dtype, device="cuda", requires_grad=True) for g in host_grads]
            for p, g in zip(params, host_grads):
                p.grad = gpu(g)
            with tinymlp.fast.enabled() if tier == "fast" else tinymlp.fast.disabled():
                total = tinymlp.optim.clip_grad_norm(params, max_norm, sync=sync)
            results[tier] = (float(total), [host(p.grad) for p in params])
        rtol = 1e-12 if np.dtype(dtype) == np.float64 else 1e-5
        np.testing.assert_allclose(results["fast"][0], norm, rtol=rtol)
        for a, b in zip(results["fast"][1], results["reference"][1]):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * 1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_kernel_normalises_rows_whose_squares_overflow(cp, dtype):
    """|x - mean| past 1.8e19 overflows float32 when squared: the kernel then scales the row by
    its largest |x - mean| first, as ops/norm.py does, instead of giving x_hat = 0."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 257)) * 1e20
    x[1] /= 1e20                                           # an ordinary row beside them
    xhat_ref, rstd_ref = norm.normalize(x, 1e-5)
    y, xhat, rstd = norm_cuda.layer_norm_forward(gpu(x, dtype), None, None, 1e-5)
    assert_close(xhat, xhat_ref, dtype, "x_hat of rows that overflow")
    np.testing.assert_allclose(host(rstd) * (1 / rstd_ref[:, 0]), 1.0, rtol=1e-5)


def test_every_kernel_passes_its_numeric_self_test(cp):
    """What the fast tier compares with NumPy before it uses its kernels (both dtypes)."""
    from tinymlp.fast import cuda

    cuda._kernel_state.clear()
    for dtype in DTYPES:
        assert cuda.kernels_work(dtype), cuda.kernel_failure(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_dropout_kernel_applies_the_hash_mask_each_way(cp, dtype):
    """The mask the kernel draws is the SplitMix64 hash of (seed, index) computed in NumPy, on any
    layout, and backward (the same seed on the gradient) applies the same mask."""
    from tinymlp.fast.kernels import dropout_cuda

    rng = np.random.default_rng(0)
    host_x = rng.standard_normal((3, 5, 33)).astype(dtype)
    x = cp.ascontiguousarray(cp.asarray(host_x).transpose(1, 0, 2)).transpose(1, 0, 2)   # token-major
    y = host(dropout_cuda.dropout_apply(x, 2024, 0.3))
    keep = dropout_cuda.hash_uniform(2024, host_x.size).reshape(host_x.shape) >= 0.3
    np.testing.assert_array_equal(y != 0, keep & (host_x != 0))
    assert_close(y, np.where(keep, host_x / 0.7, 0), dtype, "dropout forward")
    assert 0.6 < keep.mean() < 0.8
    g = host(dropout_cuda.dropout_apply(gpu(np.ones(host_x.shape), dtype), 2024, 0.3))
    np.testing.assert_array_equal(g != 0, keep)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", WIDTHS)
def test_the_softmax_forward_kernel_matches_the_formula(cp, dtype, width):
    from tinymlp.fast.kernels import attention_cuda

    rng = np.random.default_rng(width)
    x = draw(rng, (4, 3, width), dtype, scale=5.0)
    p = np.exp(0.25 * x.astype(np.float64) - (0.25 * x.astype(np.float64)).max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert_close(attention_cuda.softmax_forward(gpu(x), 0.25), p, dtype, "softmax forward")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("alpha", [0.0, 0.1])
def test_the_cross_entropy_kernels_match_the_reference(cp, dtype, alpha):
    """The fused forward (softmax, rows, their sum) and backward against the reference op."""
    from tinymlp.fast.kernels import loss_cuda
    from tinymlp.ops.loss import CrossEntropy

    rng = np.random.default_rng(3)
    x = draw(rng, (7, 257), dtype, scale=4.0)
    y = rng.integers(0, 257, 7)
    with tinymlp.fast.disabled():
        xt = tensor(x, dtype=dtype, requires_grad=True)
        ref = CrossEntropy.apply(xt, y, label_smoothing=alpha)
        ref.backward(np.array(3.0, dtype=dtype))
    p, rows = loss_cuda.cross_entropy_forward(gpu(x), gpu(y), alpha)
    assert_close(rows.sum(), ref.data, dtype, "cross-entropy")
    dx = loss_cuda.cross_entropy_backward(p, gpu(y), gpu(np.array(3.0), dtype), alpha)
    assert_close(dx, xt.grad, dtype, "cross-entropy backward")


@pytest.mark.parametrize("layout", ["column", "every other", "int32"])
def test_cross_entropy_kernel_takes_strided_and_int32_class_ids_and_refuses_host_ones(cp, layout):
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((6, 9)).astype(np.float32)
    table = rng.integers(0, 9, size=(12, 2))
    ids = {"column": table[:6, 1], "every other": table[::2, 0], "int32": table[:6, 0]}[layout]
    on_gpu = tensor(table, device="cuda")
    device_ids = {"column": on_gpu[:6, 1], "every other": on_gpu[::2, 0],
                  "int32": tensor(table[:6, 0].astype(np.int32), device="cuda")}[layout]
    x = tensor(logits, device="cuda", requires_grad=True)
    F.cross_entropy(x, device_ids, label_smoothing=0.1).backward()
    ref = tensor(logits, requires_grad=True)
    loss = F.cross_entropy(ref, tensor(ids), label_smoothing=0.1)
    loss.backward()
    np.testing.assert_allclose(host(x.grad), ref.grad, rtol=1e-5, atol=1e-7)
    for batch in (1, 5):
        with pytest.raises(RuntimeError, match="different devices"):
            F.cross_entropy(tensor(logits[:batch], device="cuda"), tensor(ids[:batch]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cublas_binding_agrees_with_cupy_matmul(cp, dtype):
    from tinymlp.fast import cublas
    rng = np.random.default_rng(4)
    a = gpu(rng.standard_normal((3, 33, 17)), dtype)
    w = gpu(rng.standard_normal((65, 17)), dtype)
    for left, right in ((a, w.T), (a.swapaxes(1, 2).copy().swapaxes(1, 2), w.T), (a[0].T, a[1])):
        rtol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
        np.testing.assert_allclose(host(cublas.matmul(left, right)), host(cp.matmul(left, right)), rtol=rtol, atol=rtol)
