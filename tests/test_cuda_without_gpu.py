"""The CUDA path's device logic, checked on a machine without a GPU.

A *stand-in* for CuPy (NumPy underneath) is registered as the ``cupy`` module, so that
``device="cuda"`` gives tensors whose arrays follow the rules of CuPy that matter here:

- no implicit conversion to NumPy: ``np.asarray(x)`` (``__array__``) raises CuPy's TypeError;
- NumPy arrays are refused as operands of device ops (``x + numpy_array``, ``xp.matmul(x, a)``);
  ``xp.asarray``/``xp.array`` (an upload) and NumPy index arrays are accepted, as on CuPy;
- reductions give 0-d device arrays, never host scalars;
- every host read (``get``, ``item``, ``float``, ``bool``, ``int``, ``tolist``, ...) is counted:
  on a GPU each one waits for every queued kernel, so none may happen inside a training step;
  so is every upload (``xp.asarray`` of host data), to find constants sent again at each step;
- a few CuPy-internal reads are modelled and counted too: ``nonzero``/``flatnonzero``/``argwhere``
  and indexing with a boolean device mask (CuPy reads the number of True values back to size
  the result), ``lib.stride_tricks.sliding_window_view`` (it validates the window shape on the
  device and reads the verdict back);
- it has no kernels: ``ElementwiseKernel``, ``RawModule`` and ``ReductionKernel`` fail when
  compiled, like a CuPy without the CUDA headers, so the fast tier's kernels fall back to its
  array code (with one warning);
- for the fast tier's own kernels, NumPy emulations (``EMULATED``) stand in for the two places
  where ``fast/cuda.py`` compiles them (``cuda.kernel``, ``cuda.elementwise``): each reads and
  writes memory as its CUDA code does, so that every launch path of the fast tier (the layouts,
  strides and buffers the Python side hands the kernels) runs here, and a test checks that a
  training step of each model launches every kernel there is.

What it cannot see: timings; the maths of the CUDA kernels (``tests/test_cuda.py`` checks them
on a GPU); CuPy-internal synchronisations other than those modelled above (allocator pressure,
``cupy.unique``, cuRAND setup, ...);
asynchronous errors; memory use; more than one stream.
"""

from __future__ import annotations

import contextlib
import math
import sys
import types

import numpy as np
import pytest
from numpy.lib.mixins import NDArrayOperatorsMixin

import tinymlp
from tinymlp import backend
from tinymlp.fast import cuda
from tinymlp.fast.kernels import activation_cuda, attention_cuda, gating_cuda, norm_cuda, optim_cuda


# ============================================================================ the stand-in
class HostReads:
    """Counts reads of device values by the host (each is a synchronisation on a GPU)."""

    def __init__(self):
        self.count, self.where = 0, []

    def record(self, what):
        import traceback

        self.count += 1
        frame = [f for f in traceback.extract_stack() if "/tinymlp/" in f.filename.replace("\\", "/")]
        self.where.append(f"{what} at {frame[-1].filename}:{frame[-1].lineno}" if frame else what)


READS = HostReads()
UPLOADS = HostReads()       # host-to-device copies (xp.asarray / xp.array of host data)
IMPLICIT = ("Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")


def _refuse_host(value, where):
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)} in {where}: a NumPy array cannot be an "
                        f"operand of a device op (upload it with cupy.asarray first)")


def _unwrap(value, where, allow_host=False):
    """DeviceArray -> its NumPy storage (recursively through tuples, lists, dicts); NumPy arrays
    are refused unless ``allow_host``."""
    if isinstance(value, DeviceArray):
        return value._a
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap(v, where, allow_host) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v, where, allow_host) for k, v in value.items()}
    if not allow_host:
        _refuse_host(value, where)
    return value


def _wrap(value):
    if isinstance(value, np.ndarray):
        return DeviceArray(value)
    if isinstance(value, np.generic):                 # CuPy gives 0-d arrays, never host scalars
        return DeviceArray(np.asarray(value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _count_mask_read(key):
    """CuPy sizes the result of boolean-mask indexing by reading the mask's count back."""
    for k in key if isinstance(key, tuple) else (key,):
        if isinstance(k, DeviceArray) and k.dtype == bool:
            READS.record("boolean mask indexing")


class _Device:
    id = 0

    def __init__(self, index=0):
        self.id = int(index)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass


class DeviceArray(NDArrayOperatorsMixin):
    """A "GPU" array: NumPy storage behind CuPy's rules (see the module docstring)."""

    __slots__ = ("_a",)
    __array_priority__ = 100

    def __init__(self, a):
        self._a = a

    # -- no implicit conversion; explicit host reads are counted
    def __array__(self, *args, **kwargs):
        raise TypeError(IMPLICIT)

    def get(self, *args, **kwargs):
        READS.record("get()")
        return self._a.copy()

    def item(self, *args):
        READS.record("item()")
        return self._a.item(*args)

    def tolist(self):
        READS.record("tolist()")
        return self._a.tolist()

    def __float__(self):
        READS.record("float()")
        return float(self._a)

    def __int__(self):
        READS.record("int()")
        return int(self._a)

    def __index__(self):
        READS.record("index()")
        return self._a.__index__()

    def __bool__(self):
        READS.record("bool()")
        return bool(self._a)

    def __repr__(self):
        return f"DeviceArray(shape={self._a.shape}, dtype={self._a.dtype})"

    # -- the array protocol of device ops
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        args = _unwrap(inputs, ufunc.__name__)
        kwargs = _unwrap(kwargs, ufunc.__name__)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:                                 # in place: the same device arrays back
            return out[0] if len(out) == 1 else out
        return _wrap(result)

    def __array_function__(self, func, types_, args, kwargs):
        return _wrap(func(*_unwrap(args, func.__name__), **_unwrap(kwargs, func.__name__)))

    # -- the ndarray surface
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: DeviceArray(self._a.T))
    device = property(lambda self: _Device(0))

    @property
    def mT(self):
        return DeviceArray(self._a.mT)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (DeviceArray(np.asarray(v)) for v in self._a)

    def __getitem__(self, key):
        _count_mask_read(key)
        return _wrap(self._a[_unwrap(key, "indexing", allow_host=True)])

    def __setitem__(self, key, value):
        _count_mask_read(key)
        self._a[_unwrap(key, "indexing", allow_host=True)] = _unwrap(value, "assignment", allow_host=True)

    def __getattr__(self, name):
        if name.startswith("__"):              # no __array_interface__ and friends: no silent host view
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        if name == "nonzero":
            READS.record("nonzero()")

        def method(*args, **kwargs):
            return _wrap(attr(*_unwrap(args, name), **_unwrap(kwargs, name)))

        return method

    def __setattr__(self, name, value):
        if name == "_a":
            object.__setattr__(self, name, value)
        elif name == "shape":
            self._a.shape = value
        else:
            raise AttributeError(f"cannot set {name} on a device array")

    def __reduce__(self):
        raise TypeError("a device array cannot be pickled without a host read")


DeviceArray.__module__ = "cupy._standin"   # the engine recognises CuPy arrays by their type's module


class CompileException(Exception):
    """What CuPy raises when NVRTC cannot compile a kernel."""


def _no_kernel(*args, **kwargs):
    class Kernel:
        def __call__(self, *a, **k):
            raise CompileException("catastrophic error: cannot open source file \"cuda_fp16.h\" (stand-in)")

        def get_function(self, name):
            return self

    return Kernel()


class _UFunc:
    """cupy.add, cupy.exp, ...: device operands only, with their methods (``add.at``, ``reduce``)."""

    def __init__(self, ufunc):
        self._u = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args, **kwargs):
        return _wrap(self._u(*_unwrap(args, self.__name__), **_unwrap(kwargs, self.__name__)))

    def __getattr__(self, name):
        attr = getattr(self._u, name)
        if not callable(attr):
            return attr
        return lambda *a, **k: _wrap(attr(*_unwrap(a, self.__name__), **_unwrap(k, self.__name__)))


class _Generator:
    """cupy.random.Generator: draws on the device."""

    def __init__(self, seed=None):
        self._g = np.random.default_rng(seed)

    def __getattr__(self, name):
        attr = getattr(self._g, name)

        def draw(*args, **kwargs):
            return _wrap(np.asarray(attr(*args, **kwargs)))

        return draw


def _sliding_window_view(x, window_shape, axis=None, **kwargs):
    window = np.atleast_1d(window_shape)
    if bool(standin.any(standin.array(window) < 0)):    # as CuPy does: a device check read back
        raise ValueError("window_shape cannot contain negative values")
    return _wrap(np.lib.stride_tricks.sliding_window_view(x._a, tuple(window), axis=axis, **kwargs))


def _make_module():
    """The stand-in ``cupy`` module (and ``cupyx``)."""
    m = types.ModuleType("cupy")
    m.__version__ = "stand-in"
    m.ndarray = DeviceArray
    m.cuda = types.SimpleNamespace(
        Device=_Device,
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1, runtimeGetVersion=lambda: 12080,
                                      driverGetVersion=lambda: 12080,
                                      getDeviceProperties=lambda i: {"name": b"stand-in", "totalGlobalMem": 2**33,
                                                                     "major": 9, "minor": 0}),
        compiler=types.SimpleNamespace(CompileException=CompileException),
    )
    m.random = types.SimpleNamespace(default_rng=_Generator, Generator=_Generator)
    m.lib = types.SimpleNamespace(stride_tricks=types.SimpleNamespace(
        as_strided=lambda x, shape=None, strides=None: DeviceArray(
            np.lib.stride_tricks.as_strided(x._a, shape=shape, strides=strides)),
        sliding_window_view=_sliding_window_view))
    m.ElementwiseKernel = m.RawModule = m.ReductionKernel = m.RawKernel = _no_kernel

    uploads = {"asarray", "array", "asanyarray"}
    host_arguments = {"split", "array_split"}
    sizes_on_host = {"nonzero", "flatnonzero", "argwhere"}        # CuPy reads the count back

    def module_getattr(name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr                                    # dtypes (cupy.float32 is numpy.float32), constants
        if isinstance(attr, np.ufunc):
            return _UFunc(attr)

        def function(*args, **kwargs):
            if name in uploads:
                if not isinstance(args[0], DeviceArray):
                    UPLOADS.record(f"{name}()")
                args = tuple(a._a if isinstance(a, DeviceArray) else a for a in args)
                return DeviceArray(np.array(args[0], *args[1:], **kwargs) if name == "array"
                                   else np.asarray(*args, **kwargs))
            if name in host_arguments:                      # e.g. split's indices: read on the host by CuPy too
                args = (_unwrap(args[0], name), *_unwrap(args[1:], name, allow_host=True))
            else:
                args = _unwrap(args, name)
            if name in sizes_on_host:
                READS.record(f"{name}()")
            result = attr(*args, **_unwrap(kwargs, name, allow_host=name in host_arguments))
            return result if name in ("may_share_memory", "shares_memory") else _wrap(result)

        function.__name__ = name
        return function

    m.__getattr__ = module_getattr
    cupyx = types.ModuleType("cupyx")
    special = types.ModuleType("cupyx.scipy.special")
    special.erf = lambda x: DeviceArray(np.vectorize(math.erf, otypes=[x.dtype])(x._a))
    special.erfc = lambda x: DeviceArray(np.vectorize(math.erfc, otypes=[x.dtype])(x._a))
    cupyx.scipy = types.SimpleNamespace(special=special)
    cupyx.allow_synchronize = lambda allow: contextlib.nullcontext()
    return m, cupyx, special


standin, standin_x, standin_special = _make_module()


@pytest.fixture
def gpu(monkeypatch):
    """The stand-in as the "cuda" device for the test; host reads counted from zero."""
    monkeypatch.setitem(sys.modules, "cupy", standin)
    monkeypatch.setitem(sys.modules, "cupyx", standin_x)
    monkeypatch.setitem(sys.modules, "cupyx.scipy", standin_x.scipy)
    monkeypatch.setitem(sys.modules, "cupyx.scipy.special", standin_special)
    monkeypatch.setattr(backend, "_cupy", standin)
    monkeypatch.setattr(backend, "_cupy_error", None)
    monkeypatch.setattr(backend, "_cuda_checked", {})
    monkeypatch.setattr(cuda, "_kernel_state", {np.dtype(np.float32): "CompileException: stand-in",
                                                np.dtype(np.float64): "CompileException: stand-in"})
    monkeypatch.setattr(backend, "_device_constants", {})
    _clear_kernel_caches()
    READS.count, READS.where = 0, []
    UPLOADS.count, UPLOADS.where = 0, []
    yield standin
    _clear_kernel_caches()


_KERNEL_CACHES = (cuda.cupy, cuda._module, cuda._function, cuda.elementwise)   # (tests replace some of them)


def _clear_kernel_caches():
    for cached in _KERNEL_CACHES:
        cached.cache_clear()


@contextlib.contextmanager
def no_host_reads(allowed=0):
    """Fail when the block reads the device more than ``allowed`` times; list where it did."""
    before = READS.count
    start = len(READS.where)
    yield
    reads = READS.where[start:]
    assert READS.count - before <= allowed, f"{READS.count - before} host read(s) in a step: {reads}"


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


def test_dropout_keeps_a_few_device_generators(gpu):
    from tinymlp.ops import dropout
    dropout._device_rngs.clear()
    hosts = [np.random.default_rng(i) for i in range(20)]
    for h in hosts:
        dropout._device_rng(gpu, h)
    assert len(dropout._device_rngs) <= dropout.MAX_DEVICE_RNGS <= 8
    last = hosts[-1]
    assert dropout._device_rng(gpu, last) is dropout._device_rng(gpu, last)   # reused, not rebuilt
    x = tinymlp.tensor(np.ones((4, 8)), device="cuda")
    with no_host_reads():
        y = tinymlp.nn.functional.dropout(x, 0.5, rng=np.random.default_rng(3)) if hasattr(tinymlp.nn, "functional") \
            else dropout.dropout(x, 0.5, rng=np.random.default_rng(3))
    assert y.device == "cuda"
    dropout._device_rngs.clear()


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


def test_fit_reports_the_first_steps_warmup_apart_from_images_per_sec():
    import time

    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.train import fit, format_epoch

    class SlowFirstCall(tinymlp.nn.Module):          # a first step that compiles for a second
        def __init__(self):
            super().__init__()
            self.inner = tinymlp.models.create("mixer_cifar", depth=1, dim=16, token_mlp_dim=8,
                                               channel_mlp_dim=16, seed=0)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 1:
                time.sleep(1.0)
            return self.inner(x)

    model = SlowFirstCall()
    loader = DataLoader(SyntheticImages(32, seed=0), 8, shuffle=False)
    history = fit(model, tinymlp.optim.SGD(model.parameters(), lr=0.01), loader, epochs=1, progress=False)
    assert history.warmup_time[0] >= 1.0
    assert history.images_per_sec[0] > 100          # 24 images after the first step, not 32 in over 1 s
    assert "first step 1." in format_epoch(history)
    later = fit(model, tinymlp.optim.SGD(model.parameters(), lr=0.01), loader, epochs=2, start_epoch=1,
                history=history, progress=False)
    assert later.warmup_time[1] is not None and len(later.to_dict()["warmup_time"]) == 2


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


def _emulated_row_kernel(source, name, dtype):
    """The raw kernels of ``fast/kernels/*_cuda.py`` in NumPy, reading and writing memory as the
    CUDA code does (rows every ``stride`` elements from the start of the array; outputs
    C-contiguous), so that the layouts the Python side hands them are checked without a GPU.
    A kernel launched from a source that does not define it fails, as it would on a GPU."""
    assert f'extern "C" __global__ void {name}(' in source, f"{name} is not defined in the source it is launched from"
    LAUNCHED.add(name)

    def run(grid, block, args):
        n = grid[0]
        if name == "layer_norm_forward":
            x, stride, w, b, y, xhat, rstd, width, eps, affine = args
            d, item = int(width), x.itemsize
            X = np.lib.stride_tricks.as_strided(x._a, (n, d), (int(stride) * item, item))
            mean = X.mean(axis=1, keepdims=True)
            r = 1 / np.sqrt(((X - mean) ** 2).mean(axis=1, keepdims=True) + eps)
            H = xhat._a.reshape(n, d)                # a view only when xhat is C-contiguous
            H[...] = (X - mean) * r
            assert np.shares_memory(H, xhat._a), "the kernel writes xhat as C-contiguous rows"
            rstd._a.reshape(n)[...] = r[:, 0]
            if affine:
                Y = y._a.reshape(n, d)
                Y[...] = H * w._a + b._a
                assert np.shares_memory(Y, y._a)
        elif name == "layer_norm_backward":
            g, xhat, rstd, w, dx, stride, width = args
            d, item = int(width), g.itemsize
            G, H = g._a.reshape(n, d), xhat._a.reshape(n, d)
            assert g._a.flags.c_contiguous and xhat._a.flags.c_contiguous and rstd._a.flags.c_contiguous
            gw = G * w._a
            D = np.lib.stride_tricks.as_strided(dx._a, (n, d), (int(stride) * item, item))
            D[...] = rstd._a.reshape(n, 1) * (gw - gw.mean(axis=1, keepdims=True)
                                              - H * (gw * H).mean(axis=1, keepdims=True))
        elif name == "layer_norm_param_partials":
            g, xhat, partial, rows, width, per_chunk = args
            d, chunks = int(width), grid[1]
            assert g._a.flags.c_contiguous and xhat._a.flags.c_contiguous
            G, H = g._a.reshape(-1, d), xhat._a.reshape(-1, d)
            assert G.shape[0] == rows and chunks * per_chunk >= rows > (chunks - 1) * per_chunk
            P = partial._a.reshape(2, chunks, d)
            for k in range(chunks):
                rows_k = slice(k * int(per_chunk), (k + 1) * int(per_chunk))
                P[0, k] = (G[rows_k] * H[rows_k]).sum(axis=0)
                P[1, k] = G[rows_k].sum(axis=0)
        elif name == "sum_chunks":
            partial, out, planes, chunks, width = args
            out._a.reshape(int(planes), int(width))[...] = \
                partial._a.reshape(int(planes), int(chunks), int(width)).sum(axis=1)
        elif name == "softmax_backward":
            p, g, dx, width = args
            d = int(width)
            assert p._a.flags.c_contiguous and g._a.flags.c_contiguous and dx._a.flags.c_contiguous
            P, G = p._a.reshape(n, d), g._a.reshape(n, d)
            dx._a.reshape(n, d)[...] = P * (G - (G * P).sum(axis=1, keepdims=True))
        else:
            raise CompileException(name)
    return run


def _emulated_elementwise(in_params, out_params, body, name):
    """The elementwise kernels of ``fast/kernels/*_cuda.py`` in NumPy, with CuPy's calling
    convention: inputs, then outputs (allocated when not given, bound by reference when given)."""
    LAUNCHED.add(name)
    c0, c1 = activation_cuda.C0, activation_cuda.C1

    def gelu(x):
        t = np.tanh(c0 * (x + c1 * x * x * x))
        h = 0.5 * (1 + t)
        return x * h, h + x * h * (1 - t) * (c0 + 3 * c0 * c1 * x * x)

    def run(*args):
        a = [v._a if isinstance(v, DeviceArray) else v for v in args]
        if name == "tinymlp_gelu_tanh_grad":
            y, d = gelu(a[0])
            return DeviceArray(y.astype(a[0].dtype)), DeviceArray(d.astype(a[0].dtype))
        if name == "tinymlp_gelu_tanh":
            return DeviceArray(gelu(a[0])[0].astype(a[0].dtype))
        if name in ("tinymlp_sgu_gate", "tinymlp_sgu_gate_residual"):
            gamma, shift, *rest = a
            residual = rest.pop(0) if name.endswith("residual") else 0
            z1, f, out = rest
            f[...] = f * gamma + shift + residual
            out[...] = z1 * f
            return args[-2], args[-1]
        if name == "tinymlp_sgu_gate_backward":
            g, f, z1, dz1, gf = a
            dz1[...] = g * f
            gf[...] = g * z1
            return args[-2], args[-1]
        raise CompileException(name)
    return run


LAUNCHED = set()      # the names of the kernels the emulations ran


@pytest.fixture
def emulated(gpu, monkeypatch):
    """Every fast-tier CUDA kernel "working" on the stand-in (both dtypes), emulated in NumPy."""
    monkeypatch.setattr(cuda, "kernel", _emulated_multi_tensor)
    monkeypatch.setattr(cuda, "elementwise", _emulated_elementwise)
    monkeypatch.setattr(cuda, "_kernel_state", {})
    monkeypatch.setattr(optim_cuda, "pointer_table", lambda arrays: (
        _Table(arrays), gpu.asarray(np.concatenate([[0], np.cumsum([a.size for a in arrays])]))))
    for dtype in (np.float32, np.float64):
        assert cuda.kernels_work(dtype)                   # the self-tests launch every kernel once
    LAUNCHED.clear()
    return gpu


def test_the_cuda_layer_norm_reads_and_writes_token_major_rows_in_place(gpu, monkeypatch):
    monkeypatch.setattr(cuda, "kernel", _emulated_row_kernel)
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


KERNEL_MODULES = (activation_cuda, attention_cuda, gating_cuda, norm_cuda, optim_cuda)


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
    assert LAUNCHED == {"softmax_backward"}, LAUNCHED               # CudaSoftmax's own launch
    p = np.exp(x_host - x_host.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(x.grad.get(), p * (g_host - (g_host * p).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-6)
    with tinymlp.no_grad():                                        # y alone, no derivative
        np.testing.assert_allclose(F.gelu(x).data.get(), F.gelu(tinymlp.tensor(x_host, dtype=dtype)).data, rtol=1e-5)
    missing = EVERY_KERNEL - LAUNCHED - launched
    assert not missing, f"kernels no step launched (their launch paths ran nowhere): {sorted(missing)}"


def test_the_layer_norm_parameter_gradients_cover_every_row_in_chunks(gpu, monkeypatch):
    """Several chunks of rows, the last one partial: each row is counted once."""
    monkeypatch.setattr(cuda, "kernel", _emulated_row_kernel)
    monkeypatch.setattr(norm_cuda, "CHUNK_BLOCKS", 3)
    rng = np.random.default_rng(1)
    for rows in (1, 32, 33, 100, 257):
        g, xhat = rng.standard_normal((rows, 5)), rng.standard_normal((rows, 5))
        dw, db = norm_cuda.layer_norm_param_grads(gpu.asarray(g), gpu.asarray(xhat))
        np.testing.assert_allclose(dw.get(), (g * xhat).sum(axis=0), rtol=1e-12)
        np.testing.assert_allclose(db.get(), g.sum(axis=0), rtol=1e-12)


class _Table(list):
    """The stand-in's pointer table: the arrays themselves, in order (no device addresses)."""


def _emulated_multi_tensor(source, name, dtype):
    """The multi-tensor kernels of ``optim_cuda`` in NumPy, in the kernels' operation order,
    over a ``_Table`` of arrays and their flat offsets (other names: ``_emulated_row_kernel``)."""
    if name not in ("adam_step", "sum_squares_partials", "clip_factor", "scale_all"):
        return _emulated_row_kernel(source, name, dtype)
    assert f'extern "C" __global__ void {name}(' in source
    LAUNCHED.add(name)

    def run(grid, block, args):
        if name == "adam_step":
            g, m, v, table, starts, count, b1, omb1, b2, omb2, eps_c, step_size, decay = args
            assert len(table) == int(count) and isinstance(table, _Table)
            G, M, V = g._a, m._a, v._a
            M[...] = M * b1 + G * omb1
            V[...] = V * b2 + (G * G) * omb2
            U = (M / (np.sqrt(V) + eps_c)) * step_size
            for k, p in enumerate(table):
                a, b = starts._a[k], starts._a[k + 1]
                p._a[...] = (p._a * decay - U[a:b].reshape(p.shape)).astype(p.dtype)
        elif name == "sum_squares_partials":
            table, starts, count, partial = args
            partial._a[...] = 0
            partial._a[0] = sum((p._a.astype(p.dtype) ** 2).sum() for p in table)
        elif name == "clip_factor":
            partial, parts, max_norm, total, scale = args
            t = np.sqrt(partial._a.sum())
            total._a[0] = t
            scale._a[0] = min(1, max_norm / (t + dtype.type(1e-6))) if np.isfinite(t) else 1
        elif name == "scale_all":
            table, starts, count, scale = args
            for p in table:
                p._a *= scale._a.reshape(-1)[0]
    return run


@pytest.fixture
def multi_tensor(gpu, monkeypatch):
    """The multi-tensor kernels "working" on the stand-in (float32), emulated in NumPy."""
    monkeypatch.setattr(cuda, "kernel", _emulated_multi_tensor)
    monkeypatch.setitem(cuda._kernel_state, np.dtype(np.float32), True)
    monkeypatch.setattr(optim_cuda, "pointer_table", lambda arrays: (
        _Table(arrays), gpu.asarray(np.concatenate([[0], np.cumsum([a.size for a in arrays])]))))
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
