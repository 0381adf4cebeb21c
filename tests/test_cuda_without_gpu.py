"""The CUDA path's device logic, checked on a machine without a GPU, through the CuPy
stand-in of ``tests/cupy_standin.py`` (its docstring lists the rules of CuPy it follows and
what it cannot see).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest

import tinymlp
from tinymlp import backend
from tinymlp.fast import cuda
from tinymlp.fast.kernels import (
    activation_cuda, attention_cuda, dropout_cuda, gating_cuda, loss_cuda, norm_cuda, optim_cuda,
)

import cupy_standin
from cupy_standin import (
    LAUNCHED, READS, UPLOADS, CompileException, emulated_kernel,
    emulated_row_kernel, no_host_reads,
)


@pytest.fixture
def gpu(monkeypatch):
    """The stand-in as the "cuda" device for the test; host reads counted from zero."""
    yield cupy_standin.install(monkeypatch)
    cupy_standin.clear_kernel_caches()


@pytest.fixture
def emulated(gpu, monkeypatch):
    """Every fast-tier CUDA kernel "working" on the stand-in (both dtypes), emulated in NumPy."""
    cupy_standin.emulate(monkeypatch)
    return gpu


# ============================================================================ the stand-in's own rules
def test_the_standin_enforces_cupys_rules(gpu):
    x = tinymlp.tensor(np.ones((2, 3)), device="cuda")
    a = x.data
    assert isinstance(a, gpu.ndarray) and backend.array_module(a) is gpu and backend.device_of(a) == "cuda"
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(a)
    with pytest.raises(TypeError, match="NumPy array cannot be an operand"):
        a + np.ones(3)
    with pytest.raises(TypeError, match="NumPy array cannot be an operand"):
        gpu.matmul(a, np.ones((3, 2)))
    before = READS.count
    total = a.sum()
    assert isinstance(total, gpu.ndarray) and READS.count == before
    assert float(total) == 6.0 and READS.count == before + 1
    with pytest.raises(TypeError):
        range(total)                                    # no __index__ on CuPy arrays
    with pytest.raises(AttributeError, match="vecdot"):
        assert gpu.vecdot is None                       # not in CuPy 14: AttributeError
    view = a[:, 1:]
    assert view.base is a.base if a.base is not None else view.base is a   # one object per array
    from cupy_standin import DeviceSynchronized, standin_x
    with standin_x.allow_synchronize(False), pytest.raises(DeviceSynchronized):
        float(total)


@pytest.mark.parametrize("name", ["mixer_cifar", "amlp_cifar"])
def test_a_training_step_runs_inside_allow_synchronize_false(emulated, name):
    """The GPU checklist's sync check, in CI: after a first step, a whole step (forward, loss,
    backward, clipping, AdamW, the schedule) with the kernels, inside allow_synchronize(False)."""
    from cupy_standin import standin_x
    model = tinymlp.models.create(name, seed=0, **SMALL[name]).to("cuda")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    scheduler = tinymlp.optim.WarmupCosine(optimizer, warmup_steps=2, total_steps=10)
    rng = np.random.default_rng(0)
    x = tinymlp.tensor(rng.random((2, 3, 32, 32)).astype(np.float32), device="cuda")
    y = tinymlp.tensor(rng.integers(0, 10, size=2), device="cuda")
    one_step(model, x, y, optimizer, scheduler)
    with standin_x.allow_synchronize(False):
        one_step(model, x, y, optimizer, scheduler)


# ============================================================================ the fixes
def test_random_crop_reads_nothing_back_and_crops_like_the_padded_batch(gpu):
    from tinymlp.data.transforms import random_crop
    images = np.random.default_rng(0).random((5, 3, 6, 7)).astype(np.float32)
    with no_host_reads():
        out = random_crop(gpu.asarray(images), 2, np.random.default_rng(1))
    got = out.get()
    rng = np.random.default_rng(1)
    oy, ox = rng.integers(0, 5, size=5), rng.integers(0, 5, size=5)
    padded = np.pad(images, ((0, 0), (0, 0), (2, 2), (2, 2)))
    for b in range(5):
        np.testing.assert_array_equal(got[b], padded[b, :, oy[b]:oy[b] + 6, ox[b]:ox[b] + 7])


def test_dropout_on_the_reference_tier_draws_the_cpus_mask_on_the_host(gpu):
    """A NumPy generator draws on the host for a GPU tensor too (an upload): the CPU's mask."""
    x_host = np.random.default_rng(0).standard_normal((4, 8))
    with tinymlp.fast.disabled():
        on_gpu = tinymlp.functional.dropout(tinymlp.tensor(x_host, device="cuda"), 0.5, rng=np.random.default_rng(3))
        on_cpu = tinymlp.functional.dropout(tinymlp.tensor(x_host), 0.5, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(on_gpu.data.get(), on_cpu.data)


def test_dropout_on_the_gpu_draws_its_mask_in_the_kernel_from_a_seed_and_resumes_exactly(emulated):
    """One kernel each way, no mask kept between forward and backward, nothing read back; a
    generator restored to a saved state (a resumed run) gives the masks the run would have drawn."""
    from tinymlp.checkpoint import generator_state, restore_generator

    x_host = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)

    def step(rng, reads=None):
        x = tinymlp.tensor(x_host, device="cuda", requires_grad=True)
        g = emulated.asarray(np.ones(x_host.shape, np.float32))
        with reads or contextlib.nullcontext():
            y = tinymlp.functional.dropout(x, 0.25, rng=rng)
            y.backward(g)
        return y.data.get(), x.grad.get()

    rng = np.random.default_rng(7)
    cupy_standin.OPS.reset()
    y1, g1 = step(rng, no_host_reads())
    kernels = [k for k in cupy_standin.OPS.kinds if k.startswith("kernel")]
    assert kernels == ["kernel tinymlp_dropout"] and cupy_standin.OPS.kinds["kernel tinymlp_dropout"] == 2
    kept = y1 != 0
    np.testing.assert_allclose(y1[kept], x_host[kept] / 0.75, rtol=1e-6)
    np.testing.assert_array_equal(g1 != 0, kept)               # backward applies the same mask
    assert 0.6 < kept.mean() < 0.9
    saved = generator_state(rng)
    y2, _ = step(rng)                                           # the uninterrupted run's next step
    y2_resumed, _ = step(restore_generator(saved))              # the same step after a resume
    np.testing.assert_array_equal(y2, y2_resumed)
    assert (y2 != y1).any()                                     # and another mask than the step before


def test_a_kernel_that_does_not_compile_falls_back_with_one_warning(gpu, monkeypatch):
    monkeypatch.setattr(cuda, "_kernel_state", {})
    with pytest.warns(RuntimeWarning, match="CUDA kernels for float32 failed to compile or run") as record:
        x = tinymlp.tensor(np.random.default_rng(0).standard_normal((3, 5)), device="cuda", dtype="float32")
        ln = tinymlp.nn.LayerNorm(5).to("cuda")
        y = tinymlp.functional.gelu(ln(x))
        y.sum().backward()
        tinymlp.functional.gelu(ln(x)).sum().backward()         # a second step: no second warning
    assert len([w for w in record if "CUDA kernels" in str(w.message)]) == 1
    expected = tinymlp.functional.gelu(ln.to("cpu")(tinymlp.tensor(x.data.get()).float()))
    np.testing.assert_allclose(y.data.get(), expected.data, rtol=1e-6, atol=1e-6)


def test_get_cupy_turns_a_failing_first_kernel_into_one_line(gpu, monkeypatch):
    def broken(*args, **kwargs):
        raise CompileException("cannot open source file \"cuda_fp16.h\"\n(long NVRTC log)")

    monkeypatch.setattr(gpu, "arange", broken, raising=False)
    with pytest.raises(tinymlp.CudaUnavailableError) as err:
        backend.get_cupy("cuda")
    message = str(err.value)
    assert "\n" not in message and "an elementwise float32 kernel failed on the GPU" in message
    assert "cuda_fp16.h" in message and '"cupy-cuda12x[ctk]"' in message and "python -m tinymlp doctor" in message
    assert "tinymlp[" not in message


def test_doctor_reports_a_gpu_that_cannot_run_a_kernel(gpu, monkeypatch, capsys):
    from tinymlp.__main__ import doctor

    def broken(*args, **kwargs):
        raise CompileException("cannot open source file \"cuda_fp16.h\"")

    monkeypatch.setattr(gpu, "arange", broken, raising=False)
    assert doctor() == 0                                   # the CPU still works
    out = capsys.readouterr().out
    assert "kernels: FAILED: an elementwise float32 kernel failed on the GPU" in out
    assert out.strip().splitlines()[-1].startswith("CPU ready; CUDA: NOT READY: an elementwise float32 kernel")


def test_doctor_says_ready_and_names_the_kernel_fallback(gpu, monkeypatch, capsys):
    from tinymlp.__main__ import doctor
    monkeypatch.setattr(cuda, "_kernel_state", {})
    with pytest.warns(RuntimeWarning, match="CUDA kernels"):
        assert doctor() == 0
    out = capsys.readouterr().out
    assert "kernels: ok" in out and "the fast tier's CUDA kernels do not compile (CompileException" in out
    assert "CUDA: ready" in out.strip().splitlines()[-1]


def test_setup_cfg_cuda_extras_bring_the_cuda_libraries():
    import configparser
    from pathlib import Path
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).parents[1] / "setup.cfg")
    extras = cfg["options.extras_require"]
    assert "cupy-cuda12x[ctk]" in extras["cuda12"] and "cupy-cuda13x[ctk]" in extras["cuda13"]


def test_no_lesson_suggests_installing_the_pypi_name_tinymlp():
    from pathlib import Path
    root = Path(__file__).parents[1] / "lessons"
    offenders = [p.name for p in root.rglob("*") if p.suffix in (".py", ".ipynb", ".md")
                 and "tinymlp[" in p.read_text(encoding="utf-8")]
    assert offenders == []


def test_fit_reports_the_first_steps_warmup_apart_from_images_per_sec(monkeypatch):
    from types import SimpleNamespace

    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.train import fit, format_epoch

    now = [0.0]                                       # fit's clock: it moves only when the model runs
    monkeypatch.setattr(tinymlp.train, "time", SimpleNamespace(perf_counter=lambda: now[0]))

    class SlowFirstCall(tinymlp.nn.Module):          # a first step that compiles for a second
        def __init__(self):
            super().__init__()
            self.inner = tinymlp.models.create("mixer_cifar", depth=1, dim=16, token_mlp_dim=8,
                                               channel_mlp_dim=16, seed=0)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            now[0] += 1.0 if self.calls == 1 else 0.01
            return self.inner(x)

    model = SlowFirstCall()
    loader = DataLoader(SyntheticImages(32, seed=0), 8, shuffle=False)
    history = fit(model, tinymlp.optim.SGD(model.parameters(), lr=0.01), loader, epochs=1, progress=False)
    assert history.warmup_time[0] == pytest.approx(1.0)
    assert history.images_per_sec[0] == pytest.approx(24 / 0.03)   # the three later steps, not 32 / 1.03 s
    assert "first step 1.0 s" in format_epoch(history)
    later = fit(model, tinymlp.optim.SGD(model.parameters(), lr=0.01), loader, epochs=2, start_epoch=1,
                history=history, progress=False)
    assert later.warmup_time[1] == pytest.approx(0.01) and len(later.to_dict()["warmup_time"]) == 2
    assert later.images_per_sec[1] == pytest.approx(24 / 0.03)


# ============================================================================ whole steps on the "GPU"
SMALL = {
    "mixer_cifar": dict(depth=2, dim=16, token_mlp_dim=8, channel_mlp_dim=32, dropout=0.1),
    "gmlp_cifar": dict(depth=2, dim=16, ffn_dim=32),
    "amlp_cifar": dict(depth=2, dim=16, ffn_dim=32, attn_dim=8),
    "vit_cifar": dict(depth=2, dim=16, heads=2, mlp_dim=32),
}


def small_model(name, device="cuda"):
    return tinymlp.models.create(name, seed=0, **SMALL[name]).to(device)


def one_step(model, images, labels, optimizer, scheduler=None):
    logits = model(images)
    loss = tinymlp.functional.cross_entropy(logits, labels)
    optimizer.zero_grad()
    loss.backward()
    tinymlp.optim.clip_grad_norm(model.parameters(), 1.0, sync=False)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return loss


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "reference"])
@pytest.mark.parametrize("name", list(SMALL))
def test_a_training_step_of_each_model_reads_nothing_back(gpu, name, fast):
    rng = np.random.default_rng(0)
    images = rng.random((4, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, size=4)
    with tinymlp.fast.enabled() if fast else tinymlp.fast.disabled():
        model = small_model(name)
        optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        scheduler = tinymlp.optim.WarmupCosine(optimizer, warmup_steps=2, total_steps=10)
        x, y = tinymlp.tensor(images, device="cuda"), tinymlp.tensor(labels, device="cuda")
        one_step(model, x, y, optimizer, scheduler)                 # the first step builds the state
        with no_host_reads():
            loss = one_step(model, x, y, optimizer, scheduler)
        assert all(isinstance(p.data, gpu.ndarray) for p in model.parameters())
        # the same step on the CPU gives the same loss: the device path computes what NumPy does
        cpu = small_model(name, "cpu")
        cpu_opt = tinymlp.optim.AdamW(cpu.parameters(), lr=1e-3, weight_decay=0.05)
        cpu_sched = tinymlp.optim.WarmupCosine(cpu_opt, warmup_steps=2, total_steps=10)
        cx, cy = tinymlp.tensor(images), tinymlp.tensor(labels)
        one_step(cpu, cx, cy, cpu_opt, cpu_sched)
        cpu_loss = one_step(cpu, cx, cy, cpu_opt, cpu_sched)
    if name != "mixer_cifar":              # (the Mixer's dropout draws differ between the devices)
        np.testing.assert_allclose(loss.data.get(), cpu_loss.data, rtol=1e-4)


def test_two_steps_of_fit_with_the_loader_and_augmentations_read_only_the_epochs_metrics(gpu):
    from tinymlp.data import DataLoader, SyntheticImages, transforms
    from tinymlp.train import fit

    data = SyntheticImages(16, seed=0)
    augment = transforms.Compose([transforms.RandomCrop(4), transforms.HorizontalFlip(),
                                  transforms.Normalize(data.mean, data.std), transforms.Mixup(0.2, 10)])
    loader = DataLoader(data, 8, shuffle=True, transform=augment, device="cuda", rng=0)
    model = small_model("mixer_cifar")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
    before = READS.count
    history = fit(model, optimizer, loader, epochs=1, clip=1.0, progress=False, sync_every=100)
    reads = READS.where[-(READS.count - before):] if READS.count > before else []
    assert READS.count - before == 1, f"fit read the device {READS.count - before} times: {reads}"
    assert "get()" in reads[0] and history.steps == [2] and np.isfinite(history.train_loss[0])


def test_checkpoint_save_and_load_from_the_gpu(gpu, tmp_path):
    from tinymlp import checkpoint
    model = small_model("gmlp_cifar")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
    x = tinymlp.tensor(np.random.default_rng(0).random((2, 3, 32, 32)), device="cuda", dtype="float32")
    one_step(model, x, tinymlp.tensor(np.array([1, 2]), device="cuda"), optimizer)
    checkpoint.save(tmp_path / "run.npz", model, optimizer, epoch=1)
    restored = small_model("gmlp_cifar")
    restored_opt = tinymlp.optim.AdamW(restored.parameters(), lr=1e-3)
    checkpoint.load(tmp_path / "run.npz", restored, restored_opt)
    for (name, p), q in zip(model.named_parameters(), restored.parameters()):
        assert isinstance(q.data, gpu.ndarray), name
        np.testing.assert_array_equal(p.data.get(), q.data.get(), err_msg=name)
    on_cpu = small_model("gmlp_cifar", "cpu")
    checkpoint.load(tmp_path / "run.npz", on_cpu)                 # a GPU run loads on a laptop
    np.testing.assert_array_equal(next(iter(on_cpu.parameters())).data, next(iter(model.parameters())).data.get())


def test_from_timm_onto_the_gpu(gpu):
    from tinymlp import interop
    cpu = tinymlp.models.create("mixer_cifar", seed=1, **SMALL["mixer_cifar"])
    state = {name: np.array(value) for name, value in interop.to_timm(cpu).items()}   # timm's names, NumPy
    model = interop.from_timm(state, gelu="tanh").to("cuda")
    x = np.random.default_rng(0).random((2, 3, 32, 32)).astype(np.float32)
    model.eval()
    cpu.eval()
    with tinymlp.no_grad(), no_host_reads():
        logits = model(tinymlp.tensor(x, device="cuda"))
    assert isinstance(logits.data, gpu.ndarray)
    np.testing.assert_allclose(logits.data.get(), cpu(tinymlp.tensor(x)).data, rtol=1e-4, atol=1e-5)


def test_constants_are_uploaded_once_per_device(gpu):
    from tinymlp.data import transforms
    images = gpu.asarray(np.random.default_rng(0).random((2, 3, 8, 8)).astype(np.float32))
    mean, std = np.array([0.5, 0.4, 0.3]), np.array([0.2, 0.2, 0.25])
    first = transforms.normalize(images, mean, std).get()
    transforms.resize(images, 12)
    before = UPLOADS.count
    again = transforms.normalize(images, mean, std)
    transforms.resize(images, 12)
    assert UPLOADS.count == before, UPLOADS.where[before:]
    np.testing.assert_array_equal(again.get(), first)
    np.testing.assert_allclose(first, (images.get() - mean[:, None, None]) / std[:, None, None], rtol=1e-5, atol=1e-6)

    model = tinymlp.models.create("gmlp_cifar", seed=0, depth=1, dim=8, ffn_dim=16, toeplitz="2d").to("cuda")
    x = tinymlp.tensor(np.ones((2, 3, 32, 32)), device="cuda", dtype="float32")
    model(x).sum().backward()
    before = UPLOADS.count
    model(x).sum().backward()
    assert UPLOADS.count == before, UPLOADS.where[before:]


def test_a_masked_lm_step_takes_the_mask_positions_from_the_loader(gpu):
    from tinymlp.data.text_loader import MaskedLMLoader, TokenDataset
    from tinymlp.models import TextGMLP
    ids = np.random.default_rng(0).integers(5, 40, size=(8, 12))
    ids[:, -3:] = 0                                                    # padding
    loader = MaskedLMLoader(TokenDataset(ids, np.zeros(8), (), vocab_size=40), 4, device="cuda", rng=0)
    model = TextGMLP(40, seq_len=12, dim=16, depth=1, ffn_dim=32, num_classes=0, lm_head=True).to("cuda")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
    batches = iter(loader)
    x, y = next(batches)
    one_step(model, x, y, optimizer)
    x, y = next(batches)
    with no_host_reads():
        loss = one_step(model, x, y, optimizer)
    masked = x.data.get() == 4
    np.testing.assert_array_equal(x.mask_positions.get(), np.flatnonzero(masked))
    assert model(x).shape == (int(masked.sum()), 40) and loss.device == "cuda"


@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["on-cpu", "on-standin"])
def test_loaders_refuse_out_of_range_labels_and_token_ids_on_the_host(gpu, device):
    from tinymlp.data import DataLoader, ImageDataset
    from tinymlp.data.text_loader import MaskedLMLoader, TokenDataset, TokenLoader
    images = np.zeros((6, 3, 4, 4), dtype=np.uint8)
    data = ImageDataset(images, np.array([0, 1, 2, 1, 3, 0]), ("a", "b", "c"))
    with pytest.raises(ValueError,
                       match=r"DataLoader: label 3 in dataset row 4 must be in \[0, 3\); the dataset has 3 classes"):
        list(DataLoader(data, 2, device=device))
    data = ImageDataset(images, np.array([0, 1, -1, 1, 2, 0]), ("a", "b", "c"))
    with pytest.raises(ValueError, match=r"label -1 in dataset row 2"):
        list(DataLoader(data, 4, device=device))
    ids = np.full((4, 6), 7)
    ids[3, 2] = 50
    tokens = TokenDataset(ids, np.array([0, 1, 1, 0]), ("neg", "pos"), vocab_size=50)
    for loader in (TokenLoader(tokens, 2, device=device), MaskedLMLoader(tokens, 2, device=device)):
        with pytest.raises(ValueError,
                           match=r"token id 50 in dataset row 3 must be in \[0, 50\); the tokenizer has 50 ids"):
            list(loader)
    tokens = TokenDataset(np.ones((2, 3)), np.array([0, 2]), ("neg", "pos"))
    with pytest.raises(ValueError, match=r"TokenLoader: label 2 in dataset row 1 must be in \[0, 2\)"):
        list(TokenLoader(tokens, 2, device=device))



def test_the_cuda_layer_norm_reads_and_writes_token_major_rows_in_place(gpu, monkeypatch):
    monkeypatch.setattr(cuda, "kernel", emulated_row_kernel)
    rng = np.random.default_rng(0)
    host = rng.standard_normal((3, 5, 8)).astype(np.float32)                        # (B, S, C)
    token_major = lambda a: gpu.asarray(np.ascontiguousarray(a.transpose(1, 0, 2))).transpose(1, 0, 2)  # noqa: E731
    x = token_major(host)
    w, b = gpu.asarray(rng.random(8, dtype=np.float32)), gpu.asarray(rng.random(8, dtype=np.float32))
    y, xhat, rstd = norm_cuda.layer_norm_forward(x, w, b, 1e-5)
    for a in (y, xhat, rstd):
        assert a.transpose(1, 0, *range(2, a.ndim)).flags.c_contiguous, "laid out like x (token-major)"
    mean, var = host.mean(-1, keepdims=True), host.var(-1, keepdims=True)
    ref_xhat = (host - mean) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(y.get(), ref_xhat * w.get() + b.get(), rtol=1e-5, atol=1e-5)
    g_host = rng.standard_normal(host.shape).astype(np.float32)
    dx, dw, db = norm_cuda.layer_norm_backward(token_major(g_host), xhat, rstd, w)
    assert dx.transpose(1, 0, 2).flags.c_contiguous
    gw = g_host * w.get()
    ref_dx = (gw - gw.mean(-1, keepdims=True) - ref_xhat * (gw * ref_xhat).mean(-1, keepdims=True)) \
        / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(dx.get(), ref_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw.get(), (g_host * ref_xhat).sum(axis=(0, 1)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db.get(), g_host.sum(axis=(0, 1)), rtol=1e-5, atol=1e-5)


def _launched_names(module):
    """The kernel names ``module``'s Python code launches: raw kernels by name, elementwise ones
    by the name they are compiled under."""
    import inspect
    import re
    code = inspect.getsource(module)
    raw = re.findall(r'cuda\.(?:kernel|launch)\(\s*SOURCE,\s*"(\w+)"', code)
    return set(raw), set(re.findall(r'"(tinymlp_\w+)"\)', code))


KERNEL_MODULES = (activation_cuda, attention_cuda, dropout_cuda, gating_cuda, loss_cuda, norm_cuda, optim_cuda)


def test_every_raw_kernel_launched_is_defined_in_its_topics_source_for_both_dtypes():
    """Without a GPU nothing compiles the CUDA source: at least every kernel the Python side
    launches by name is defined in the source it is launched from, with C linkage, and each
    source builds for each dtype."""
    import re
    for module in KERNEL_MODULES:
        launched, _ = _launched_names(module)
        if not hasattr(module, "SOURCE"):
            assert not launched, module.__name__
            continue
        assert launched, f"{module.__name__} has a SOURCE but launches nothing from it"
        for dtype in (np.float32, np.float64):
            source = cuda.source(module.SOURCE, dtype)
            defined = set(re.findall(r'extern "C" __global__ void (\w+)\(', source))
            assert launched == defined, f"{module.__name__}: launched {sorted(launched)}, defined {sorted(defined)}"
            assert source.count("{") == source.count("}") and source.count("(") == source.count(")")


EVERY_KERNEL = set().union(*(set().union(*_launched_names(m)) for m in KERNEL_MODULES))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.slow
def test_training_steps_with_the_kernels_launch_every_kernel_and_follow_the_cpu(emulated, dtype):
    """Each model's fast training step on the "GPU", with every kernel emulated: the loss and
    every gradient are the CPU's, nothing is read back, and between them the steps (plus a
    softmax and an inference forward) launch every kernel of the fast tier: each launch path of
    the CUDA code runs here, with the layouts the models give it."""
    rng = np.random.default_rng(0)
    images = rng.random((4, 3, 32, 32)).astype(dtype)
    labels = rng.integers(0, 10, size=4)
    for name in SMALL:
        kwargs = {**SMALL[name], "dropout": 0.0} if name == "mixer_cifar" else SMALL[name]
        losses, grads = {}, {}
        for device in ("cuda", "cpu"):
            model = tinymlp.models.create(name, seed=0, **kwargs)
            noise = np.random.default_rng(1)
            for p in model.parameters():          # away from the initialisation (W = 0 in an SGU)
                p.data[...] += 0.05 * noise.standard_normal(p.shape).astype(p.dtype)
            model = model.to(device, dtype=dtype)
            optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
            x, y = tinymlp.tensor(images, device=device, dtype=dtype), tinymlp.tensor(labels, device=device)
            one_step(model, x, y, optimizer)                        # the first step builds the state
            with no_host_reads() if device == "cuda" else contextlib.nullcontext():
                losses[device] = one_step(model, x, y, optimizer)
            grads[device] = [backend.to_device(p.grad, "cpu") for p in model.parameters()]
        tol = 1e-4 if dtype == "float32" else 1e-9
        np.testing.assert_allclose(losses["cuda"].data.get(), losses["cpu"].data, rtol=tol, err_msg=name)
        scale = max(float(np.abs(b).max()) for b in grads["cpu"])     # (some are round-off: a key's bias)
        for i, (a, b) in enumerate(zip(grads["cuda"], grads["cpu"])):
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale, err_msg=f"{name} grad {i}")
    F = tinymlp.functional
    x_host, g_host = rng.standard_normal((3, 5)).astype(dtype), rng.standard_normal((3, 5)).astype(dtype)
    x = tinymlp.tensor(x_host, device="cuda", dtype=dtype, requires_grad=True)
    launched = set(LAUNCHED)
    LAUNCHED.clear()
    F.softmax(x).backward(emulated.asarray(g_host))
    assert LAUNCHED == {"softmax_forward", "softmax_backward"}, LAUNCHED   # CudaSoftmax's own launches
    p = np.exp(x_host - x_host.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(x.grad.get(), p * (g_host - (g_host * p).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-6)
    with tinymlp.no_grad():                                        # y alone, no derivative
        np.testing.assert_allclose(F.gelu(x).data.get(), F.gelu(tinymlp.tensor(x_host, dtype=dtype)).data, rtol=1e-5)
    F.dropout(x, 0.5, rng=np.random.default_rng(0)).sum().backward()   # (the models above drop nothing)
    missing = EVERY_KERNEL - LAUNCHED - launched
    assert not missing, f"kernels no step launched (their launch paths ran nowhere): {sorted(missing)}"


def test_the_layer_norm_parameter_gradients_cover_every_row_in_chunks(gpu, monkeypatch):
    """Several chunks of rows, the last one partial: each row is counted once."""
    monkeypatch.setattr(cuda, "compile_kernel", emulated_row_kernel)
    cupy_standin.clear_kernel_caches()
    monkeypatch.setattr(norm_cuda, "CHUNK_BLOCKS", 3)
    rng = np.random.default_rng(1)
    for rows in (1, 32, 33, 100, 257):
        g, xhat = rng.standard_normal((rows, 5)), rng.standard_normal((rows, 5))
        dw, db = norm_cuda.layer_norm_param_grads(gpu.asarray(g), gpu.asarray(xhat))
        np.testing.assert_allclose(dw.get(), (g * xhat).sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(db.get(), g.sum(axis=0), rtol=1e-12)




@pytest.fixture
def multi_tensor(gpu, monkeypatch):
    """The multi-tensor kernels "working" on the stand-in (float32), emulated in NumPy."""
    monkeypatch.setattr(cuda, "compile_kernel", emulated_kernel)
    cupy_standin.clear_kernel_caches()
    monkeypatch.setitem(cuda._kernel_state, np.dtype(np.float32), True)
    return gpu


def test_adamw_on_the_gpu_is_one_kernel_and_follows_the_cpu(multi_tensor, monkeypatch):
    """The fused step updates every parameter from its own slice of the flat buffers, with the
    scalars of the array code: the same parameters as the CPU after three steps."""
    launched = []
    kernel = optim_cuda.adam_step
    monkeypatch.setattr(optim_cuda, "adam_step", lambda *a, **k: launched.append(1) or kernel(*a, **k))
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (1,), (5,), (2, 2, 2)]
    values = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    results = {}
    for device in ("cpu", "cuda"):
        params = [tinymlp.tensor(v.copy(), device=device, requires_grad=True) for v in values]
        opt = tinymlp.optim.AdamW(params, lr=0.1, weight_decay=0.3)
        for step in grads:
            for p, g in zip(params, step):
                p.grad = backend.to_device(g, device)
            with no_host_reads():
                opt.step()
        results[device] = [backend.to_device(p.data, "cpu") for p in params]
    assert len(launched) == 3, "one fused launch per step on the GPU"
    for a, b in zip(results["cuda"], results["cpu"]):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_clipping_on_the_gpu_scales_every_gradient_by_the_joint_norm_without_a_read(multi_tensor):
    rng = np.random.default_rng(1)
    host = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (1,), (6,)]]
    norm = math.sqrt(sum(float((h.astype(np.float64) ** 2).sum()) for h in host))
    for max_norm in (norm / 4, norm * 2):                  # clipped, then left alone
        params = [tinymlp.tensor(np.zeros(h.shape, np.float32), device="cuda", requires_grad=True) for h in host]
        for p, h in zip(params, host):
            p.grad = multi_tensor.asarray(h.copy())   # (the stand-in shares host memory)
        with no_host_reads():
            total = tinymlp.optim.clip_grad_norm(params, max_norm, sync=False)
        np.testing.assert_allclose(float(total), norm, rtol=1e-6)
        factor = min(1.0, max_norm / (norm + 1e-6))
        for p, h in zip(params, host):
            np.testing.assert_allclose(p.grad.get(), h * factor, rtol=1e-6)
    params[0].grad[0, 0] = np.inf                          # not finite: the gradients stay as they are
    before = [p.grad.get() for p in params]
    assert math.isinf(tinymlp.optim.clip_grad_norm(params, 1.0))
    for p, b in zip(params, before):
        np.testing.assert_array_equal(p.grad.get(), b)


def test_the_in_place_guard_on_the_gpu_sees_writes_through_tinymlp_and_says_data_writes_are_cpu_only(gpu):
    from pathlib import Path
    w = tinymlp.tensor(np.ones(3), device="cuda", requires_grad=True)
    loss = (w * w).sum()
    with tinymlp.no_grad():
        w -= 0.1                                             # a write through tinymlp: seen on the GPU
    with pytest.raises(RuntimeError, match="modified in place|changed"):
        loss.backward()
    w2 = tinymlp.tensor(np.ones(3), device="cuda", requires_grad=True)
    loss2 = (w2 * w2).sum()
    with no_host_reads():
        w2.data[...] = 2.0                                   # not checksummed on the GPU: no read
    loss2.backward()
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme.split("### On a GPU", 1)[1].split("\n## ", 1)[0]
    assert "in-place guard" in section and "t.data[...] = v" in section
    assert "On the CPU\n        only" in tinymlp.Tensor.data.__doc__
    assert "CPU arrays only" in tinymlp.guard.before_raw_access.__doc__


# ============================================================================ device operations per step
def test_a_kernel_that_computes_wrong_numbers_falls_back_with_one_warning(gpu, monkeypatch):
    """The self-test compares every kernel's numbers with NumPy's before the kernels are used:
    a kernel that runs but computes something else is not used (the array code computes)."""
    def broken(source, name, dtype):
        run = emulated_kernel(source, name, dtype)
        if name != "softmax_backward":
            return run

        def wrong(grid, block, args):
            run(grid, block, args)
            args[2]._a[...] *= 2                           # dx twice what it should be
        return wrong

    cupy_standin.emulate(monkeypatch, check=False)
    monkeypatch.setattr(cuda, "compile_kernel", broken)
    cupy_standin.clear_kernel_caches()
    monkeypatch.setattr(cuda, "_kernel_state", {})
    with pytest.warns(RuntimeWarning, match="the softmax backward computed other numbers than NumPy"):
        assert not cuda.kernels_work(np.float32)
    x = tinymlp.tensor(np.ones((2, 3), np.float32), device="cuda")
    assert not cuda.applies(x.data)                        # the fast ops take their array code


def _step_ops(model, x, y, optimizer):
    """(device operations of one training step, of its clipping and optimizer step alone)."""
    ops = cupy_standin.OPS
    ops.reset()
    optimizer.zero_grad()
    loss = tinymlp.functional.cross_entropy(model(x), y)
    loss.backward()
    before = ops.count
    tinymlp.optim.clip_grad_norm(model.parameters(), 1.0, sync=False)
    optimizer.step()
    return ops, ops.count - before


@pytest.mark.parametrize("name", [n if n == "mixer_cifar" else pytest.param(n, marks=pytest.mark.slow) for n in SMALL])
def test_a_training_step_copies_no_gradient_and_updates_all_parameters_in_a_few_launches(emulated, name):
    """What keeps a GPU step from being bound by the host: each parameter's gradient is the
    array its op's backward made (no copy a parameter), and clipping and AdamW cost a few
    launches for all the parameters together, however many there are."""
    model = tinymlp.models.create(name, seed=0, **SMALL[name]).to("cuda")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    rng = np.random.default_rng(0)
    x = tinymlp.tensor(rng.random((2, 3, 32, 32)).astype(np.float32), device="cuda")
    y = tinymlp.tensor(rng.integers(0, 10, size=2), device="cuda")
    _step_ops(model, x, y, optimizer)                        # the first step builds the state
    _step_ops(model, x, y, optimizer)                        # (and the pointer tables)
    ops, update = _step_ops(model, x, y, optimizer)
    copies = {site: n for (kind, site), n in ops.sites.items() if kind == "copy" and site.startswith("autograd")}
    assert not copies, f"gradients copied by the engine: {copies}"
    assert len(list(model.parameters())) > 10
    # the norm (2 launches), the scaling (1), gathering the gradients (1), AdamW (1), the upload of
    # the step's scalars (1), and, when the memory pool gave the gradients new addresses, the
    # upload of their table (addresses and offsets: 2)
    assert update <= 8, f"{update} device operations to clip and update {len(list(model.parameters()))} parameters"
