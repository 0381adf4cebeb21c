"""Bad input gets a clear error (issue 14): each message names the op or argument, what was given
and what was expected. Each test here failed (silently, or with a raw NumPy/zipfile/JSON message)
before the check it exercises was written."""

import os

import numpy as np
import pytest
from numpy.exceptions import AxisError

import tinymlp
from tinymlp import backend, tensor


# ---------------------------------------------------------------------- reductions
@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("axis", [2, -3, (0, 2)])
def test_a_reduction_over_an_axis_the_tensor_lacks_is_refused(op, axis):
    x = tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(AxisError) as err:          # AxisError is a ValueError and an IndexError, as in NumPy
        getattr(x, op)(axis=axis)
    message = str(err.value)
    assert message.startswith(f"{op}:") and "out of bounds" in message and "duplicate" not in message
    bad = axis[1] if isinstance(axis, tuple) else axis
    assert f"axis {bad}" in message and "2 dimension" in message and "(2, 3)" in message and "-2..1" in message
    with pytest.raises(AxisError):
        getattr(tinymlp.ops, op)(x, axis=axis)


def test_a_reduction_naming_one_axis_twice_says_so_and_valid_axes_still_work():
    x = tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(ValueError, match=r"sum: axis \(1, -1\) names the same axis twice"):
        x.sum(axis=(1, -1))
    assert x.sum(axis=(0, -1)).item() == 15 and x.max(axis=np.int64(-1)).tolist() == [2, 5]
    with pytest.raises(AxisError, match="stack: axis 3"):
        tinymlp.ops.stack([x, x], axis=3)
    with pytest.raises(AxisError, match="swapaxes: axis 2"):
        x.swapaxes(0, 2)


# ---------------------------------------------------------------------- construction
@pytest.mark.parametrize("data,error,words", [
    (None, TypeError, "from None"),
    (1 + 2j, TypeError, "complex"),
    ([1j, 2.0], TypeError, "complex"),
    ("abc", TypeError, "string"),
    (["a", "b"], TypeError, "string"),
    ([1.0, None], TypeError, "object"),
    (np.array([1, 2], dtype=object), TypeError, "object"),
    ([[1.0, 2.0], [3.0]], ValueError, "ragged (rows of different lengths)"),
])
def test_tensor_refuses_data_that_is_not_real_numbers_and_says_what_it_accepts(data, error, words):
    with pytest.raises(error) as err:
        tensor(data)
    message = str(err.value)
    assert message.startswith("tensor():") and words in message
    assert "bool, integer or float" in message and "list of numbers" in message


def test_tensor_refuses_a_complex_dtype_asked_for():
    with pytest.raises(TypeError, match=r"tensor\(\): the dtype asked for is complex"):
        tensor([1.0, 2.0], dtype=complex)


def test_casting_a_tensor_that_requires_grad_to_an_integer_dtype_is_refused():
    x = tensor([1.5, 2.5], requires_grad=True)
    for cast in (lambda: x.to(dtype=int), lambda: x.astype("int32"), lambda: (x * 2).to(dtype=np.int64)):
        with pytest.raises(TypeError) as err:
            cast()
        assert "astype" in str(err.value) and "int" in str(err.value) and "requires grad" in str(err.value)
        assert "detach()" in str(err.value)
    assert x.detach().to(dtype=int).tolist() == [1, 2]          # the way out the message names
    with tinymlp.no_grad():
        assert x.astype("int32").dtype == np.int32
    assert x.to(dtype="float64").requires_grad                  # float casts stay differentiable


# ---------------------------------------------------------------------- primitives
@pytest.mark.parametrize("a,b,words", [
    ((2, 3), (4, 5), "a's last axis (3) to equal b's second-to-last axis (4)"),
    ((2, 3), (4,), "a's last axis (3) to equal b's only axis (4)"),
    ((2, 2, 3), (3, 3, 1), "batch axis -3 has sizes 2 and 3"),
])
def test_matmul_shape_errors_name_the_op_and_both_shapes(a, b, words):
    with pytest.raises(ValueError) as err:
        tensor(np.ones(a)) @ tensor(np.ones(b))
    message = str(err.value)
    assert message.startswith("matmul:") and str(a) in message and str(b) in message and words in message


@pytest.mark.parametrize("op,name", [(lambda a, b: a + b, "add"), (lambda a, b: a - b, "sub"),
                                     (lambda a, b: a * b, "mul"), (lambda a, b: a / b, "div")])
def test_broadcasting_errors_name_the_op_and_both_shapes(op, name):
    a, b = tensor(np.ones((2, 3))), tensor(np.ones(4))
    with pytest.raises(ValueError) as err:
        op(a, b)
    message = str(err.value)
    assert message.startswith(f"{name}:") and "(2, 3)" in message and "(4,)" in message
    assert "axis -1 has sizes 3 and 4" in message
    with pytest.raises(ValueError, match=rf"{name}: shapes \(2, 3\) and \(3, 3\)"):
        op(a, np.ones((3, 3)))                                  # an array constant, too


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "tanh", "sigmoid"])
def test_float_ops_on_an_integer_tensor_name_the_op_and_the_dtype(name):
    x = tensor([1, 2, 3])
    with pytest.raises(TypeError) as err:
        getattr(x, name)()
    message = str(err.value)
    assert message.startswith(f"{name}:") and "int64" in message and "floating-point" in message
    assert "x.float()" in message


def test_require_float_is_the_shared_check():
    backend.require_float("softmax", np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="softmax: the logits must be a floating-point tensor, got dtype int32"):
        backend.require_float("softmax", tensor(np.ones(3, dtype=np.int32)), "logits")


# ---------------------------------------------------------------------- checkpoints
from tinymlp import checkpoint  # noqa: E402
from tinymlp.checkpoint import CheckpointError  # noqa: E402
from tinymlp.nn import Module, Parameter  # noqa: E402


class Small(Module):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(np.arange(6.0).reshape(2, 3))

    def forward(self, x):
        return x @ self.weight


def saved(tmp_path, optimizer=None):
    model = Small()
    path = tmp_path / "run.npz"
    checkpoint.save(path, model, optimizer, epoch=1)
    return path, model


def damaged_header(path):
    """The checkpoint with its JSON header's bytes garbled (the zip itself intact)."""
    import zipfile
    entries = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            entries[name] = z.read(name)
    header = np.lib.format.read_array(__import__("io").BytesIO(entries["__header__.npy"]))
    buf = __import__("io").BytesIO()
    np.lib.format.write_array(buf, np.frombuffer(b'{"format": "tinymlp-chec', dtype=np.uint8))
    assert header.size > 24
    entries["__header__.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)


@pytest.mark.parametrize("how,words", [
    ("random", "not a tinymlp checkpoint"),
    ("truncated", "damaged or truncated"),
    ("empty", "is empty (0 bytes"),
    ("npy", "single NumPy array (.npy"),
    ("header", "__header__ entry is damaged"),
    ("missing", "no such file"),
    ("folder", "is a folder"),
])
def test_every_checkpoint_load_failure_is_one_checkpoint_error_naming_the_file(tmp_path, how, words):
    path, model = saved(tmp_path)
    if how == "random":
        path.write_bytes(np.random.default_rng(0).bytes(500))
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "npy":
        path = tmp_path / "weights.npy"
        np.save(path, np.ones(3))
    elif how == "header":
        damaged_header(path)
    elif how == "missing":
        path = tmp_path / "nope.npz"
    elif how == "folder":
        path = tmp_path
    for reader in (lambda: checkpoint.load(path, Small()), lambda: checkpoint.read_meta(path)):
        with pytest.raises(CheckpointError) as err:
            reader()
        message = str(err.value)
        assert str(path) in message and words in message, message
        assert "pickle" not in message and "\n" not in message


def test_saving_into_a_missing_folder_names_the_folder(tmp_path):
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError) as err:
        checkpoint.save(missing / "run.npz", Small())
    assert str(missing) in str(err.value) and "does not exist" in str(err.value) and ".tmp" not in str(err.value)


def test_a_killed_saves_temporary_file_is_removed_by_the_next_save(tmp_path):
    import subprocess
    import sys
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    leftover = tmp_path / f".run.npz.{dead.stdout.strip()}.abc123.tmp"   # a save killed mid-write
    legacy = tmp_path / ".run.npz.x7q_k2.tmp"                           # the old naming, no pid
    running = tmp_path / f".run.npz.{os.getppid()}.zz.tmp"             # a live process's save: kept
    other = tmp_path / ".other.npz.1.zz.tmp"                            # another checkpoint's: kept
    longer = tmp_path / f".run.npz.7.{dead.stdout.strip()}.zz.tmp"      # "run.npz.7"'s save: kept
    for f in (leftover, legacy, running, other, longer):
        f.write_bytes(b"partial")
    path, _ = saved(tmp_path)
    assert not leftover.exists() and not legacy.exists() and running.exists() and other.exists() and longer.exists()
    assert checkpoint.read_meta(path)["epoch"] == 1


def test_an_optimizer_state_of_another_type_is_refused(tmp_path):
    from tinymlp.optim import SGD, AdamW
    model = Small()
    path = tmp_path / "run.npz"
    checkpoint.save(path, model, AdamW(model.parameters(), lr=1e-3))
    sgd = SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError) as err:
        checkpoint.load(path, Small(), sgd)
    message = str(err.value)
    assert str(path) in message and "AdamW" in message and "SGD" in message and "optimizer=None" in message
    assert sgd.param_groups[0]["lr"] == 0.1
    checkpoint.load(path, Small(), AdamW(Small().parameters(), lr=0.5))   # the same type loads


# ---------------------------------------------------------------------- CUDA without a GPU, doctor
class FakeRuntime:
    def __init__(self, error=None, count=0):
        self.error, self.count = error, count

    def getDeviceCount(self):
        if self.error:
            raise self.error
        return self.count


def fake_cupy(monkeypatch, runtime, driver_present):
    import types
    cupy = types.SimpleNamespace(__version__="13.6.0", cuda=types.SimpleNamespace(runtime=runtime))
    monkeypatch.setattr(backend, "_cupy", cupy)
    monkeypatch.setattr(backend, "_cupy_error", None)
    monkeypatch.setattr(backend, "_nvidia_driver_present", lambda: driver_present)


def cuda_message():
    with pytest.raises(tinymlp.CudaUnavailableError) as err:
        backend.get_cupy("cuda")
    return err.value


def assert_good_advice(message):
    assert "device='cpu'" in message and "leave out --device cuda" in message
    assert "tinymlp[" not in message                      # the PyPI name tinymlp is another project's
    assert "python -m tinymlp doctor" in message


def test_cuda_without_cupy_says_so_and_offers_the_cpu(monkeypatch):
    monkeypatch.setattr(backend, "_cupy", None)
    monkeypatch.setattr(backend, "_cupy_error", "ModuleNotFoundError: No module named 'cupy'")
    err = cuda_message()
    message = str(err)
    assert err.reason == "CuPy is not installed" and "device 'cuda' is not available: CuPy is not installed" in message
    assert 'pip install -e ".[cuda12]"' in message and 'pip install "cupy-cuda12x[ctk]"' in message
    assert_good_advice(message)


def test_cuda_without_a_driver_says_no_nvidia_driver_found(monkeypatch):
    error = RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")
    fake_cupy(monkeypatch, FakeRuntime(error), driver_present=False)
    err = cuda_message()
    assert err.reason == "no NVIDIA driver found" and "no NVIDIA driver found" in str(err)
    assert "pip install" not in str(err)                 # re-running the install would not help
    assert_good_advice(str(err))


def test_cuda_with_a_driver_but_no_device_says_no_device(monkeypatch):
    error = RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    fake_cupy(monkeypatch, FakeRuntime(error), driver_present=True)
    err = cuda_message()
    assert err.reason == "no CUDA device visible" and "CUDA_VISIBLE_DEVICES" in str(err)
    assert_good_advice(str(err))
    fake_cupy(monkeypatch, FakeRuntime(RuntimeError("CUDA driver version is insufficient")), driver_present=True)
    assert cuda_message().reason == "the NVIDIA driver is too old for CuPy's CUDA"


def test_doctor_ends_with_a_verdict_and_exits_0_when_the_cpu_works(monkeypatch, capsys):
    from tinymlp.__main__ import doctor

    fake_cupy(monkeypatch, FakeRuntime(RuntimeError("CUDA driver version is insufficient")), driver_present=False)
    assert doctor() == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "CPU ready; CUDA: no NVIDIA driver found"
    monkeypatch.setattr(backend, "_cupy", None)
    monkeypatch.setattr(backend, "_cupy_error", "ModuleNotFoundError: No module named 'cupy'")
    assert doctor() == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1] == "CPU ready; CUDA: CuPy is not installed"
    assert "tinymlp[" not in out and 'pip install -e ".[cuda12]"' in out


def test_doctor_says_which_cpu_kernels_a_step_runs(monkeypatch, capsys):
    import tinymlp.fast
    from tinymlp.__main__ import doctor
    from tinymlp.fast import compiled

    monkeypatch.setattr(backend, "_cupy", None)
    monkeypatch.setattr(backend, "_cupy_error", "ModuleNotFoundError: No module named 'cupy'")

    def kernels_line():
        assert doctor() == 0
        return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kernels"))

    assert kernels_line() == f"kernels fast tier on; compiled kernels: {compiled.describe()}"
    monkeypatch.setitem(compiled._state, "numba", None)          # as without the [fast] extra
    line = kernels_line()
    assert "numba not installed: NumPy fast path" in line and '".[fast]"' in line
    with tinymlp.fast.disabled():
        assert "reference tier" in kernels_line()


def test_the_distribution_has_a_name_of_its_own_on_pypi():
    import configparser
    from pathlib import Path
    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    assert config["metadata"]["name"] == "tinymlp-edu"       # "tinymlp" on PyPI is an unrelated project


# ---------------------------------------------------------------------- hyper-parameters
def _params():
    return [tensor(np.ones(3), requires_grad=True)]


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("build,argument,given", [
    (lambda o, p: o.SGD(p, lr=NAN), "lr", "nan"),
    (lambda o, p: o.SGD(p, lr=-0.1), "lr", "-0.1"),
    (lambda o, p: o.AdamW(p, lr=INF), "lr", "inf"),
    (lambda o, p: o.AdamW(p, weight_decay=-0.05), "weight_decay", "-0.05"),
    (lambda o, p: o.SGD(p, lr=0.1, weight_decay=NAN), "weight_decay", "nan"),
    (lambda o, p: o.Adam(p, betas=(0.9, 1.0)), "betas[1]", "1.0"),
    (lambda o, p: o.Adam(p, betas=(NAN, 0.999)), "betas[0]", "nan"),
    (lambda o, p: o.AdamW(p, eps=0.0), "eps", "0.0"),
    (lambda o, p: o.AdamW(p, eps=INF), "eps", "inf"),
    (lambda o, p: o.SGD(p, lr=0.1, momentum=1.5), "momentum", "1.5"),
    (lambda o, p: o.SGD(p, lr=0.1, momentum=NAN), "momentum", "nan"),
    (lambda o, p: o.SGD([{"params": p, "lr": NAN}], lr=0.1), "lr", "nan"),
    (lambda o, p: o.WarmupLinear(o.SGD(p, lr=0.1), warmup_steps=INF, total_steps=10), "warmup_steps", "inf"),
    (lambda o, p: o.WarmupCosine(o.SGD(p, lr=0.1), warmup_steps=-1, total_steps=10), "warmup_steps", "-1"),
    (lambda o, p: o.WarmupLinear(o.SGD(p, lr=0.1), warmup_steps=0, total_steps=NAN), "total_steps", "nan"),
    (lambda o, p: o.clip_grad_norm(p, 0.0), "max_norm", "0.0"),
    (lambda o, p: o.clip_grad_norm(p, -1.0), "max_norm", "-1.0"),
    (lambda o, p: o.clip_grad_norm(p, NAN, sync=False), "max_norm", "nan"),
])
def test_bad_hyperparameters_are_refused_by_the_library_naming_the_argument(build, argument, given):
    from tinymlp import optim
    params = _params()
    params[0].grad = np.full(3, 2.0)
    with pytest.raises(ValueError) as err:
        build(optim, params)
    message = str(err.value)
    assert f"{argument}={given}" in message and "expected" in message and argument in message.split("expected")[1]
    assert params[0].grad.tolist() == [2.0, 2.0, 2.0]          # clip_grad_norm(max_norm <= 0) flips nothing


def test_setting_a_bad_lr_later_is_refused_too():
    from tinymlp.optim import SGD
    opt = SGD(_params(), lr=0.1)
    with pytest.raises(ValueError, match="SGD: lr=nan is not a finite number"):
        opt.lr = NAN
    assert opt.lr == 0.1


def test_argmax_and_flatten_refuse_an_axis_the_tensor_lacks():
    x = tensor(np.arange(24.0).reshape(2, 3, 4))
    with pytest.raises(AxisError, match=r"argmax: axis 3 is out of bounds .* \(shape \(2, 3, 4\)\)"):
        x.argmax(axis=3)
    with pytest.raises(AxisError, match="flatten: axis 3 is out of bounds"):
        x.flatten(3)
    assert x.flatten(1).shape == (2, 12) and x.flatten(-1).shape == (2, 3, 4) and x.argmax(axis=-1).shape == (2, 3)


# --------------------------------------------------------------------------- ops, layers and models
@pytest.mark.parametrize("op, call", [
    ("softmax", lambda x: tinymlp.functional.softmax(x)),
    ("layer_norm", lambda x: tinymlp.functional.layer_norm(x, None, None)),
    ("cross_entropy", lambda x: tinymlp.functional.cross_entropy(x, np.array([0, 1]))),
])
def test_layers_on_an_integer_tensor_name_the_op_and_the_dtype(op, call):
    x = tinymlp.tensor(np.arange(6).reshape(2, 3))
    with pytest.raises(TypeError, match=rf"{op}: the .* must be a floating-point tensor, got dtype int64"):
        call(x)


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_layer_norm_refuses_a_non_positive_eps(eps):
    x = tinymlp.tensor(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"layer_norm: eps must be > 0"):
        tinymlp.functional.layer_norm(x, None, None, eps=eps)


@pytest.mark.parametrize("sizes", [(0, 3), (-1, 3), (3, 0)])
def test_linear_layer_sizes_must_be_positive(sizes):
    with pytest.raises(ValueError, match=r"Linear: in_features and out_features must be >= 1"):
        tinymlp.nn.Linear(*sizes)


@pytest.mark.parametrize("name, overrides, what", [
    ("mixer_cifar", {"depth": 0}, "depth"), ("mixer_cifar", {"dim": 0}, "dim"),
    ("gmlp_cifar", {"depth": 0}, "depth"), ("vit_b16", {"heads": 0}, "heads"),
])
def test_models_refuse_zero_depth_and_width(name, overrides, what):
    with pytest.raises(ValueError, match=rf"{what} must be an integer >= 1, got 0"):
        tinymlp.models.create(name, **overrides)


def test_an_empty_batch_into_a_model_says_so():
    model = tinymlp.models.create("mixer_cifar", depth=1)
    with pytest.raises(ValueError, match="PatchEmbedding: got an empty batch"):
        model(tinymlp.tensor(np.zeros((0, 3, 32, 32), dtype=np.float32)))
