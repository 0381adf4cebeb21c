"""The autograd engine: graph building, the backward pass, its errors and its dtype rules.

Expected gradients here are written out by hand in NumPy (a formula independent of the
engine), so a test fails if the engine routes, accumulates or frees gradients wrongly.
"""

import gc
import sys
import types
import weakref

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp import Function, Tensor, autograd, contract, fast, graph, no_grad, tensor
from tinymlp.contract import GradientMismatchError
from tinymlp.fast.engine import take_saved
from tinymlp.ops.elementwise import Mul


def leaf(values, dtype="float64", device="cpu"):
    return tensor(np.asarray(values), requires_grad=True, dtype=dtype, device=device)


# ------------------------------------------------------------------ accumulation in one graph
def test_fan_out_accumulates_every_path():
    """f(x) = tanh(x) * x uses x twice: df/dx = (1 - tanh(x)^2) x + tanh(x)."""
    rng = np.random.default_rng(0)
    xv, g = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    x = leaf(xv)
    (x.tanh() * x).backward(g)
    t = np.tanh(xv)
    np.testing.assert_allclose(x.grad, g * ((1 - t * t) * xv + t), rtol=1e-12)


def test_same_tensor_twice_in_one_op_and_in_a_sum():
    x = leaf([1.0, -2.0, 3.0])
    (x * x + x + x).sum().backward()  # d/dx (x^2 + 2x) = 2x + 2
    np.testing.assert_array_equal(x.grad, [4.0, -2.0, 8.0])


def test_diamond_graph_sums_both_branches():
    """x -> a = exp(x) -> (a * 2, a * 3) -> sum: the node a must run backward once, with 5 g."""
    x = leaf([0.5, -1.0])
    a = x.exp()
    (a * 2.0 + a * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad, 5 * np.exp([0.5, -1.0]), rtol=1e-12)


def test_reused_parameter_gets_the_sum_of_both_uses():
    """out = (x @ W) @ W.  With G = dL/dout:  dL/dW = x^T G W^T + (x W)^T G."""
    rng = np.random.default_rng(1)
    xv, wv, g = rng.normal(size=(2, 3)), rng.normal(size=(3, 3)), rng.normal(size=(2, 3))
    x, w = leaf(xv), leaf(wv)
    ((x @ w) @ w).backward(g)
    np.testing.assert_allclose(w.grad, xv.T @ g @ wv.T + (xv @ wv).T @ g, rtol=1e-12)
    np.testing.assert_allclose(x.grad, g @ wv.T @ wv.T, rtol=1e-12)


# ------------------------------------------------------------------ backward twice, freeing
def test_backward_twice_with_retain_graph_accumulates():
    x = leaf([1.0, 2.0, 3.0])
    y = (x * x).sum()
    y.backward(retain_graph=True)
    np.testing.assert_array_equal(x.grad, [2.0, 4.0, 6.0])
    y.backward()
    np.testing.assert_array_equal(x.grad, [4.0, 8.0, 12.0])


def test_gradients_of_separate_graphs_accumulate_until_zero_grad():
    x = leaf([1.0, 2.0])
    (x * 3.0).sum().backward()
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [5.0, 7.0])
    x.zero_grad()
    assert x.grad is None
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 3.0])


def test_leaf_grad_is_not_an_alias_of_an_array_in_the_graph():
    """Accumulating into x.grad must not write into the upstream gradient the caller passed."""
    x = leaf([1.0, 2.0])
    g = np.array([1.0, 1.0])
    (x + 0.0).backward(g)
    (x + 0.0).backward(g)
    np.testing.assert_array_equal(g, [1.0, 1.0])
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])


def _fresh(made):
    """A Function (x * 2) whose backward returns a new array and notes it in ``made`` (a weak
    reference: a strong one would count as a holder)."""

    class Fresh(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            out = g * 2
            made.append(weakref.ref(out))
            return out

    return Fresh


@pytest.mark.parametrize("tier", ["fast", "reference"])
def test_a_leaf_keeps_a_gradient_no_one_else_holds_without_copying_it(tier):
    """Under the fast engine a backward's fresh array becomes the leaf's .grad as it is (a copy
    would be one more pass over memory, and one more launch a parameter on a GPU); the reference
    engine copies it, plainly."""
    made = []
    with fast.enabled() if tier == "fast" else fast.disabled():
        x = leaf([1.0, 2.0])
        _fresh(made).apply(x).sum().backward()
    assert (made[0]() is x.grad) == (tier == "fast")
    np.testing.assert_array_equal(x.grad, [2.0, 2.0])


@pytest.mark.parametrize("tier", ["fast", "reference"])
def test_no_engine_writes_into_a_gradient_that_something_else_holds(tier):
    """Where gradients meet, or a leaf keeps one, an array that something else holds (a saved
    array, one handed to two inputs, a view of either) is never written."""
    with fast.enabled() if tier == "fast" else fast.disabled():
        _holders_stay_unwritten()
        _views_of_holders_stay_unwritten()


def _holders_stay_unwritten():
    made = []
    Fresh = _fresh(made)
    x = leaf([1.0, 2.0])
    (Fresh.apply(x) + Fresh.apply(x) * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad, [8.0, 8.0])

    kept = np.array([5.0, 6.0])

    class GivesKept(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return kept                            # an array someone else holds

    y = leaf([1.0, 2.0])
    u = y * 1.0
    (GivesKept.apply(u) + GivesKept.apply(u) + u + u).sum().backward()
    np.testing.assert_array_equal(kept, [5.0, 6.0])
    np.testing.assert_array_equal(y.grad, [12.0, 14.0])


def _views_of_holders_stay_unwritten():
    class Spy(Function):                             # y = x
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g.copy()

    kept = np.arange(6.0)

    class GivesKeptView(Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return kept.reshape(2, 3)                # a view of an array someone else holds

    y = leaf(np.ones((2, 3)))
    u = Spy.apply(y)
    (GivesKeptView.apply(u) + GivesKeptView.apply(u) + u).sum().backward()
    np.testing.assert_array_equal(kept, np.arange(6.0))
    np.testing.assert_array_equal(y.grad, 2 * np.arange(6.0).reshape(2, 3) + 1)


def test_leaf_gradients_never_share_memory_with_each_other_or_a_saved_array():
    """What a leaf may not keep as it is: one array handed to two leaves (Add's backward), a view,
    an array a graph kept by retain_graph still holds. Accumulating into one leaf's .grad must
    change nothing else."""
    a, b = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    (a + b).sum().backward()                             # Add returns the same g for both
    assert not np.shares_memory(a.grad, b.grad)
    a.grad += 1
    np.testing.assert_array_equal(b.grad, [1.0, 1.0])

    x = leaf([[1.0, 2.0], [3.0, 4.0]])
    (x.reshape(4) * 3.0).sum().backward()                # Reshape's backward returns a view of g
    assert x.grad.base is None and x.grad.shape == (2, 2)   # a whole array of its own

    saved = np.array([5.0, 6.0])

    class GivesSaved(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(saved)
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return ctx.saved_tensors[0]                  # an array the graph still holds

    w = leaf([0.0, 0.0])
    out = GivesSaved.apply(w).sum()
    out.backward(retain_graph=True)
    out.backward()
    np.testing.assert_array_equal(w.grad, [10.0, 12.0])
    np.testing.assert_array_equal(saved, [5.0, 6.0])     # the second backward added into a copy


def test_second_backward_without_retain_graph_raises_clearly():
    x = leaf([1.0, 2.0])
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])  # the failed call added nothing


def test_graph_is_freed_after_backward():
    x = leaf([1.0, -2.0, 3.0])
    h = x.relu()  # ReLU saves a boolean mask that nothing else references
    y = (h * 2.0).sum()
    mask = weakref.ref(h.grad_fn.saved_tensors[0])
    y.backward()
    gc.collect()
    assert mask() is None
    assert h.grad_fn is graph.FREED and y.grad_fn is graph.FREED
    assert x.grad_fn is None  # leaves stay leaves


def test_retain_graph_keeps_saved_arrays():
    x = leaf([1.0, -2.0, 3.0])
    h = x.relu()
    mask = weakref.ref(h.grad_fn.saved_tensors[0])
    h.sum().backward(retain_graph=True)
    gc.collect()
    assert mask() is not None
    assert h.grad_fn is not graph.FREED


def _saved_array_probe(freed):
    """A Function that saves its input and, in backward, drops it and records whether that freed it."""

    class Probe(autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2.0

        @staticmethod
        def backward(ctx, grad):
            (x,) = take_saved(ctx)
            ref = weakref.ref(x)
            del x
            freed.append(ref() is None)
            return grad * 2.0

    return Probe


@pytest.mark.parametrize("tier", ["fast", "reference"])
def test_a_saved_array_dropped_on_the_last_backward_is_freed_there(tier):
    """What a fast op releases during its last backward (a Linear its input, before it allocates
    the input's gradient; ``take_saved``) is freed then under the fast engine: the in-place guard,
    its check done, does not keep it alive. The reference engine frees the node after its backward."""
    freed = []
    Probe = _saved_array_probe(freed)
    with fast.enabled() if tier == "fast" else fast.disabled():
        x = leaf(np.ones((4, 3)))
        y = Probe.apply(x * 3.0).sum()          # the probe's input: an intermediate no one else holds
        y.backward()
    assert freed == [tier == "fast"]


def test_what_a_node_kept_on_ctx_is_freed_once_its_last_backward_ran():
    """An array forward set as a ctx attribute (not saved) goes with the node, as soon as the
    node's last backward has run: not at the end of the whole backward pass."""
    seen = []

    class Keeps(autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.kept = np.full(x.shape, 2.0)
            seen.append(weakref.ref(ctx.kept))
            return x * 2.0

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.kept

    class Looks(autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.copy()

        @staticmethod
        def backward(ctx, grad):
            seen.append(seen[0]() is None)          # Keeps ran before this (it came later in forward)
            return grad

    x = leaf(np.ones(3))
    Keeps.apply(Looks.apply(x)).sum().backward()
    assert seen[1] is True
    np.testing.assert_array_equal(x.grad, [2.0, 2.0, 2.0])


def test_a_retained_graph_keeps_the_saved_array_for_the_guard_of_the_next_backward():
    freed = []
    Probe = _saved_array_probe(freed)
    x = leaf(np.ones((4, 3)))
    h = x * 3.0
    y = Probe.apply(h).sum()
    del h
    y.backward(retain_graph=True)
    assert freed == [False]                 # the graph (and its guard) still needs it
    y.backward()
    assert freed == [False, True]
    np.testing.assert_array_equal(x.grad, np.full((4, 3), 12.0))


# ------------------------------------------------------------------ no_grad
def test_no_grad_context_builds_no_graph():
    x = leaf([1.0, 2.0])
    with no_grad():
        assert not tinymlp.is_grad_enabled()
        y = (x * 2.0).exp().sum()
    assert tinymlp.is_grad_enabled()
    assert y.requires_grad is False and y.grad_fn is None
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.backward()


def test_no_grad_as_decorator_and_restored_after_an_exception():
    @no_grad()
    def step(t):
        return t * t + 1.0

    x = leaf([3.0])
    y = step(x)
    assert y.requires_grad is False and y.grad_fn is None
    assert tinymlp.is_grad_enabled()

    with pytest.raises(ZeroDivisionError):
        with no_grad():
            raise ZeroDivisionError
    assert tinymlp.is_grad_enabled()


def test_no_grad_decorated_function_may_recurse():
    """Each call of a decorated function must restore the mode it found, even when nested."""

    @no_grad()
    def countdown(n):
        return countdown(n - 1) if n else tinymlp.is_grad_enabled()

    with tinymlp.enable_grad():  # restores the mode on exit even if the decorator does not
        assert countdown(2) is False
        assert tinymlp.is_grad_enabled()


def test_enable_grad_inside_no_grad():
    x = leaf([3.0])
    with no_grad():
        with tinymlp.enable_grad():
            y = x * x
        z = x * x
    assert y.requires_grad and y.grad_fn is not None
    assert not z.requires_grad and z.grad_fn is None


# ------------------------------------------------------------------ deep graphs
@pytest.mark.slow
def test_chain_of_100k_ops_backpropagates_without_recursion():
    n = 100_000
    assert sys.getrecursionlimit() < n  # a recursive topological sort would fail here
    x = leaf([1.0, 2.0])
    y = x
    for _ in range(n):
        y = y + 1.0
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])
    np.testing.assert_array_equal(y.data, [1.0 + n, 2.0 + n])


@pytest.mark.slow
def test_unused_deep_chain_is_deleted_without_crashing():
    y = leaf([0.0])
    for _ in range(100_000):
        y = -y
    del y  # dropping a long never-freed graph must not overflow the C stack
    gc.collect()


# ------------------------------------------------------------------ devices
class _FakeCudaArray(np.ndarray):
    """A distinct array type that reports GPU 0: stands in for a CuPy array on a CPU machine."""

    device = types.SimpleNamespace(id=0)


@pytest.fixture
def fake_cupy(monkeypatch):
    """Make the backend see ``_FakeCudaArray`` as ``cupy.ndarray`` (restored after the test)."""
    module = types.ModuleType("cupy")
    module.ndarray = _FakeCudaArray
    monkeypatch.setitem(sys.modules, "cupy", module)
    return module


def _on_fake_gpu(values):
    return Tensor.from_array(np.asarray(values, dtype=np.float32).view(_FakeCudaArray), None)


def test_cpu_tensor_meeting_a_cuda_tensor_names_the_op_and_both_devices(fake_cupy):
    a = tensor([1.0, 2.0], requires_grad=True)
    b = _on_fake_gpu([3.0, 4.0])
    assert b.device == "cuda"
    with pytest.raises(RuntimeError) as err:
        a * b
    message = str(err.value)
    assert "Mul" in message and "cpu" in message and "cuda" in message


class _FakeSecondGpuArray(_FakeCudaArray):
    device = types.SimpleNamespace(id=1)


def test_an_array_off_gpu_0_never_enters_a_tensor(fake_cupy):
    """The ops check devices only where array types differ, so the ways into a Tensor refuse a
    CuPy array on another GPU: the constructor (``tinymlp.tensor(..., device=...)``, tested with
    CUDA) and the ``.data`` setter."""
    off = np.ones(2, dtype=np.float32).view(_FakeSecondGpuArray)
    t = _on_fake_gpu([1.0, 2.0])
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=1"):
        t.data = off
    assert t.data.device.id == 0


def test_check_same_device_unit(fake_cupy):
    a, b = tensor([1.0, 2.0]), _on_fake_gpu([3.0, 4.0])
    with pytest.raises(RuntimeError, match="different devices"):
        contract.check_inputs(Mul, (a, b), (a.data, b.data), {}, False)
    c = np.ones(2, dtype=np.float32)  # constants are not checked: ops convert them themselves
    contract.check_inputs(Mul, (a, 2.0, c), (a.data, 2.0, c), {}, False)
    contract.check_inputs(Mul, (b, b), (b.data, b.data), {}, False)


def test_results_of_full_reductions_stay_usable_on_the_cpu():
    """NumPy returns scalars (np.float64, not ndarray) from full reductions and 1-D @ 1-D;
    such results must still combine with other CPU tensors."""
    xv = np.array([1.0, 2.0, 4.0])
    x = leaf(xv)
    y = x / x.sum()  # d/dx_j sum_i g_i x_i / s = g_j / s - (g . x) / s^2
    g = np.array([1.0, -1.0, 0.5])
    y.backward(g)
    s = xv.sum()
    np.testing.assert_allclose(x.grad, g / s - (g @ xv) / s**2, rtol=1e-12)

    a, b = leaf([1.0, 2.0]), leaf([3.0, -1.0])
    ((a @ b) * a).sum().backward()  # d/da (a.b) sum(a) = b sum(a) + a.b
    np.testing.assert_allclose(a.grad, [3.0 * 3 + 1.0, -1.0 * 3 + 1.0])
    for result in (x.sum(), x.mean(), x.max(), a @ b):  # .data is always an array
        assert isinstance(result.data, np.ndarray) and result.device == "cpu"


@pytest.mark.cuda
def test_real_cpu_and_cuda_tensors_do_not_mix():
    a = tensor([1.0, 2.0], requires_grad=True)
    b = tensor([1.0, 2.0], device="cuda")
    with pytest.raises(RuntimeError) as err:
        a + b
    assert "Add" in str(err.value) and "cuda" in str(err.value) and "cpu" in str(err.value)


@pytest.mark.skipif(tinymlp.cuda_available(), reason="CUDA is available here")
def test_asking_for_cuda_without_cupy_says_how_to_install_it():
    with pytest.raises(tinymlp.CudaUnavailableError) as err:
        tinymlp.tensor([1.0], device="cuda")
    assert 'pip install -e ".[cuda12]"' in str(err.value) and "tinymlp[" not in str(err.value)
    with pytest.raises(tinymlp.CudaUnavailableError):
        tinymlp.tensor([1.0]).to("cuda")
    assert issubclass(tinymlp.CudaUnavailableError, RuntimeError)


def test_unknown_device_name_is_rejected():
    with pytest.raises(ValueError, match="unknown device"):
        tinymlp.tensor([1.0], device="tpu")


@pytest.mark.parametrize("name", ["cuda", "CUDA", "gpu", "cuda:0", " cuda:00 "])
def test_every_name_of_the_gpu_is_cuda(name):
    assert tinymlp.backend.parse_device(name) == "cuda"


@pytest.mark.parametrize("name", ["cuda:1", "cuda:7"])
def test_a_second_gpu_is_chosen_with_cuda_visible_devices(name):
    with pytest.raises(ValueError, match=f"CUDA_VISIBLE_DEVICES={name[-1]}.*device='cuda'"):
        tinymlp.tensor([1.0], device=name)
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        tinymlp.nn.Linear(2, 3).to(name)


# ------------------------------------------------------------------ user errors
@pytest.mark.parametrize("values", [[1, 2], [True, False], np.arange(3, dtype=np.int32)])
def test_integer_or_bool_tensor_cannot_require_grad(values):
    with pytest.raises(TypeError, match="floating-point"):
        tensor(values, requires_grad=True)
    with pytest.raises(TypeError, match="floating-point"):
        tensor(values).requires_grad_()


def test_backward_on_a_non_scalar_needs_a_gradient():
    x = leaf(np.ones((2, 3)))
    y = x * 2.0
    with pytest.raises(RuntimeError, match=r"\(2, 3\)"):
        y.backward()
    with pytest.raises(RuntimeError, match="shape"):
        y.backward(np.ones(3))
    y.backward(np.ones((2, 3)))
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 2.0))


def test_backward_on_a_one_element_non_0d_tensor_is_allowed():
    x = leaf([[3.0]])
    (x * x).backward()
    np.testing.assert_array_equal(x.grad, [[6.0]])


class SumRowsBadShape(Function):
    """A planted bug: backward forgets to broadcast the gradient back over axis 0."""

    @staticmethod
    def forward(ctx, x):
        return x.sum(axis=0)

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_backward_of_wrong_shape_names_the_function_and_both_shapes():
    x = leaf(np.ones((2, 3)))
    with pytest.raises(RuntimeError) as err:
        SumRowsBadShape.apply(x).sum().backward()
    message = str(err.value)
    assert "SumRowsBadShape" in message and "(3,)" in message and "(2, 3)" in message


class DoubleUpcast(Function):
    """A planted bug: backward multiplies by a float64 array, upcasting a float32 gradient."""

    @staticmethod
    def forward(ctx, x):
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        return grad * np.full(grad.shape, 2.0)


def test_backward_returning_float64_for_float32_input_raises():
    x = tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError) as err:
        DoubleUpcast.apply(x).sum().backward()
    message = str(err.value)
    assert "DoubleUpcast" in message and "float64" in message and "float32" in message


# ------------------------------------------------------------------ Functions written by students
class Cube(Function):
    """out = x^3;  dL/dx = 3 x^2 g."""

    calls = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        Cube.calls.append(ctx.needs_input_grad)
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad


class ScaledProduct(Function):
    """out = scale * a * b;  dL/da = scale * b g,  dL/db = scale * a g  (only those asked for)."""

    asked = []

    @staticmethod
    def forward(ctx, a, b, scale=1.0):
        ctx.save_for_backward(a, b)
        ctx.scale = scale
        return scale * a * b

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        ScaledProduct.asked.append((need_a, need_b))
        return (
            ctx.scale * b * grad if need_a else None,
            ctx.scale * a * grad if need_b else None,
        )


def test_student_function_forward_and_backward():
    Cube.calls.clear()
    x = leaf([1.0, -2.0])
    y = Cube.apply(x)
    assert isinstance(y, Tensor) and y.requires_grad
    np.testing.assert_array_equal(y.data, [1.0, -8.0])
    y.backward(np.array([1.0, 0.5]))
    np.testing.assert_array_equal(x.grad, [3.0, 6.0])
    assert Cube.calls == [(True,)]


def test_needs_input_grad_marks_constants_and_keyword_options_pass_through():
    ScaledProduct.asked.clear()
    a = leaf([1.0, 2.0])
    b = tensor([3.0, 4.0], dtype="float64")  # a constant tensor
    ScaledProduct.apply(a, b, scale=2.0).sum().backward()
    assert ScaledProduct.asked == [(True, False)]
    np.testing.assert_array_equal(a.grad, [6.0, 8.0])
    assert b.grad is None

    ScaledProduct.apply(np.array([1.0, 1.0]), a).sum().backward()  # an array constant first
    assert ScaledProduct.asked[-1] == (False, True)
    np.testing.assert_array_equal(a.grad, [7.0, 9.0])


def test_function_on_constants_only_records_nothing():
    Cube.calls.clear()
    y = Cube.apply(tensor([2.0]))
    assert not y.requires_grad and y.grad_fn is None
    np.testing.assert_array_equal(y.data, [8.0])
    assert Cube.calls == []


# ------------------------------------------------------------------ small Tensor API of the engine
def test_detach_shares_data_and_stops_the_gradient():
    x = leaf([2.0, 3.0])
    d = x.detach()
    assert d.data is x.data and not d.requires_grad and d.grad_fn is None
    (d * x).sum().backward()  # d is a constant: the gradient is x, not 2x
    np.testing.assert_array_equal(x.grad, [2.0, 3.0])


def test_item_numpy_to_and_zero_grad():
    x = tensor([[2.5]], requires_grad=True)
    assert x.item() == 2.5 and isinstance(x.item(), float)
    with pytest.raises(ValueError, match="one element"):
        tensor([1.0, 2.0]).item()
    arr = x.numpy()
    assert isinstance(arr, np.ndarray) and np.shares_memory(arr, x.data)
    assert x.to("cpu") is x and x.to(device="cpu", dtype="float32") is x
    x.sum().backward()
    assert x.grad is not None
    x.zero_grad()
    assert x.grad is None


def test_to_dtype_is_differentiable():
    x = tensor([1.0, 2.0], requires_grad=True)
    y = x.to(dtype="float64")
    assert y.dtype == np.float64 and y.requires_grad
    (y * y).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])


# ------------------------------------------------------------------ dtypes
@pytest.mark.parametrize(
    "data", [1.5, [1.0, 2.0], np.ones(3), np.ones(3, dtype=np.float16), np.float64(2.0)],
)
def test_floats_become_float32_by_default(data):
    assert tensor(data).dtype == np.float32
    assert Tensor(data).dtype == np.float32


def test_explicit_dtype_is_kept_and_integers_keep_their_type():
    x = tensor(np.ones(3), dtype="float64")
    assert x.dtype == np.float64
    assert (x * 2.0 + 1).exp().dtype == np.float64
    assert tensor([1, 2]).dtype == np.int64
    assert tensor(np.arange(3, dtype=np.int32)).dtype == np.int32
    assert tensor([True]).dtype == np.bool_
    assert tensor([1, 2], dtype="float32").dtype == np.float32


CONSTANTS = {
    "python float": 2.0,
    "python int": 3,
    "numpy float64 scalar": np.float64(2.0),
    "numpy float64 0-d array": np.array(2.0),
    "numpy float64 array": np.array([2.0, 3.0, 0.5]),
    "numpy int array": np.array([1, 2, 3]),
}
BINARY = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
    "**": lambda a, b: a**b,
}


@pytest.mark.parametrize("op", BINARY.values(), ids=BINARY.keys())
@pytest.mark.parametrize("const", CONSTANTS.values(), ids=CONSTANTS.keys())
@pytest.mark.parametrize("tensor_first", [True, False], ids=["x op c", "c op x"])
def test_constants_do_not_upcast_float32(op, const, tensor_first):
    x = tensor([0.5, 1.5, 2.0], requires_grad=True)
    y = op(x, const) if tensor_first else op(const, x)
    assert isinstance(y, Tensor)
    assert y.dtype == np.float32
    y.sum().backward()  # the engine refuses a float64 gradient for x
    assert x.grad.dtype == np.float32


def test_float32_matmul_with_a_float64_array_stays_float32():
    x = tensor(np.ones((2, 3)), requires_grad=True)
    w = np.ones((3, 4))
    assert (x @ w).dtype == np.float32 and (w.T @ x.T).dtype == np.float32


def test_backward_takes_an_upstream_gradient_in_the_root_dtype():
    """A float64 gradient passed to backward() on a float32 result is cast, not blamed on an op."""
    w = tinymlp.tensor(np.ones((3, 2)), requires_grad=True)
    y = tinymlp.tensor(np.ones((4, 3))) @ w
    y.backward(tinymlp.tensor(np.ones((4, 2)), dtype="float64"))
    assert w.grad.dtype == np.float32 and np.all(w.grad == 4)


def test_gradient_mismatch_error_carries_the_facts():
    class Bad(tinymlp.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g.sum(axis=0)

    x = tinymlp.tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(tinymlp.contract.GradientMismatchError) as info:
        Bad.apply(x).sum().backward()
    err = info.value
    assert (err.fn, err.index, err.kind, err.got, err.expected) == ("Bad", 0, "shape", (3,), (2, 3))


# --------------------------------------------------------------------------- the contract, enforced
class _Mul(Function):
    """x * w, with a backward chosen by the test."""

    result = None

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return _Mul.result(g, x, w)


@pytest.mark.parametrize("returned, message", [
    (lambda g, x, w: g * w, r"_Mul.backward returned 1 gradient for 2 inputs"),
    (lambda g, x, w: (g * w, g * x, g), r"_Mul.backward returned 3 gradients for 2 inputs"),
    (lambda g, x, w: (2.0, g * x), r"returned a float as the gradient of input 0.*raw arrays"),
    (lambda g, x, w: (Tensor(g), g * x), r"returned a Tensor as the gradient of input 0"),
])
def test_backward_must_return_one_array_per_input(monkeypatch, returned, message):
    monkeypatch.setattr(_Mul, "result", staticmethod(returned))
    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    with pytest.raises(GradientMismatchError, match=message):
        _Mul.apply(x, w).sum().backward()


def test_trailing_non_array_inputs_may_be_left_out():
    """Reshape(x, shape) returns one gradient: the shape is not an array."""
    x = leaf(np.arange(6.0))
    x.reshape(2, 3).sum().backward()
    np.testing.assert_array_equal(x.grad, np.ones(6))


def test_a_function_without_backward_says_so():
    class Double(Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x

    with pytest.raises(NotImplementedError, match="Double has no backward: define @staticmethod backward"):
        Double.apply(leaf([1.0])).sum().backward()


def test_a_saved_input_modified_in_place_is_refused_naming_the_op_and_the_input():
    x, w = leaf(np.ones((3, 4))), leaf(np.ones((4, 2)))
    y = F.linear(x, w).sum()
    w.data[...] = 2.0
    with pytest.raises(RuntimeError, match=r"Linear: input 1 'weight', of shape \(4, 2\), was modified in place"):
        y.backward()


def test_an_optimizer_step_before_backward_is_refused():
    from tinymlp import nn, optim

    layer = nn.Linear(3, 2)
    opt = optim.SGD(layer.parameters(), lr=0.1)
    loss = layer(Tensor(np.ones((4, 3), dtype=np.float32))).sum()
    for p in layer.parameters():
        p.grad = np.ones_like(p.data)
    opt.step()                                   # changes the weight forward saved
    with pytest.raises(RuntimeError, match="modified in place by an in-place operation .*optimizer step"):
        loss.backward()


def test_an_input_that_was_not_saved_may_change():
    """Add saves nothing: changing its input in place does not touch its gradient."""
    x = leaf([1.0, 2.0])
    y = (x + 1.0).sum()
    x.data[...] = 5.0
    y.backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


# ------------------------------------------------------------------ the in-place guard, every element
@pytest.mark.parametrize("where", [(0, 1), (150, 151), (299, 298)])
def test_a_change_of_any_one_element_of_a_saved_input_is_refused(where):
    """Not a sample of the values: every element counts (a 300 x 300 weight, one element moved)."""
    rng = np.random.default_rng(0)
    x, w = leaf(rng.normal(size=(2, 300))), leaf(rng.normal(size=(300, 300)))
    y = F.linear(x, w).sum()
    w.data[where] += 1e-3
    with pytest.raises(RuntimeError, match=r"Linear: input 1 'weight'.*modified in place through its array"):
        y.backward()


def test_reading_a_saved_input_without_writing_is_fine():
    x, w = leaf(np.ones((2, 3))), leaf(np.ones((3, 2)))
    y = F.linear(x, w).sum()
    assert float(w.data.sum()) == 6.0 and float(np.asarray(w).sum()) == 6.0 and w.numpy().shape == (3, 2)
    y.backward()
    np.testing.assert_array_equal(w.grad, np.full((3, 2), 2.0))


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_an_optimizer_step_before_backward_is_refused_on_both_tiers(name, tier):
    """The flat-buffer step of the fast tier writes without touching p.data: its version counts."""
    from tinymlp import nn, optim

    model = nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Linear(4, 2))
    opt = getattr(optim, name)(model.parameters(), lr=0.1)
    x = Tensor(np.ones((5, 3), dtype=np.float32))
    model(x).sum().backward()
    opt.step()                                   # a first step: buffers made, nothing pending
    loss = model(x).sum()
    opt.step()                                   # the old gradients, applied before backward
    with pytest.raises(RuntimeError, match="optimizer step before backward"):
        loss.backward()


def test_changing_one_parameter_does_not_stop_a_graph_that_saved_another():
    """Parameters share the optimizer's flat buffer; a write into one is not a write into all."""
    from tinymlp import nn, optim

    a, b = nn.Linear(3, 3), nn.Linear(3, 3)
    opt = optim.Adam([*a.parameters(), *b.parameters()], lr=0.1)
    x = Tensor(np.ones((2, 3), dtype=np.float32))
    (a(x).sum() + b(x).sum()).backward()
    opt.step()                                   # the flat buffer now backs all four parameters
    loss = b(x).sum()
    with no_grad():
        a.weight -= 1.0
    loss.backward()
    assert b.weight.grad is not None


def test_a_second_backward_with_retained_graph_checks_again():
    x, w = leaf(np.ones((2, 3))), leaf(np.ones((3, 2)))
    y = F.linear(x, w).sum()
    y.backward(retain_graph=True)
    w.data[1, 1] = 7.0
    with pytest.raises(RuntimeError, match="modified in place"):
        y.backward()


def test_a_tensor_passed_by_keyword_is_refused():
    class Scale(Function):
        @staticmethod
        def forward(ctx, x, w=None):
            ctx.save_for_backward(w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            (w,) = ctx.saved_tensors
            return g * w

    x, w = leaf([1.0, 2.0]), leaf([3.0, 4.0])
    with pytest.raises(TypeError,
                       match=r"Scale.apply: the tensor 'w' was passed by keyword; pass tensors positionally"):
        Scale.apply(x, w=w)


def test_float32_meeting_float64_is_refused_at_forward_naming_the_op_and_both_dtypes():
    x32 = tensor([1.0, 2.0], requires_grad=True)                      # float32 by default
    c64 = tensor([3.0, 4.0], dtype="float64")
    with pytest.raises(TypeError, match=r"Add: input 0 'a' is float32 but input 1 'b' is float64.*x\.float\(\)"):
        x32 + c64
    w64 = leaf(np.ones((2, 2)))
    with pytest.raises(TypeError, match=r"MatMul: input 0 'a' is float32 but input 1 'b' is float64"):
        x32 @ w64
    # no gradient goes to the narrower input: the wider result is fine, as in NumPy
    assert (w64 @ tensor([1.0, 2.0])).dtype == np.float64
    with no_grad():
        assert (x32 + c64).dtype == np.float64


# --------------------------------------------------------------------------- the engine students read
def test_the_engine_is_one_short_file_and_its_walk_is_the_one_in_graph():
    """Lesson 02 sends students to tinymlp/autograd.py as "about 200 lines, worth reading top to
    bottom": it stays that, holds the algorithm alone (no name of the fast engine's savings), and
    backward walks the graph with graph.nodes (the one walk), which the fast engine inherits."""
    import inspect
    import re
    from pathlib import Path

    from tinymlp import graph
    from tinymlp.fast.engine import FastEngine
    text = Path(autograd.__file__).read_text(encoding="utf-8")
    assert text.count("\n") <= 220, f"tinymlp/autograd.py has {text.count(chr(10))} lines"
    fast_words = re.findall(r"pending|takes_bias|derivative|getrefcount|sole|pop_saved|take_saved|"
                            r"gradient_so_far|backward_into|retain_graph =", text)
    assert not fast_words, fast_words
    assert "graph.nodes(" in inspect.getsource(autograd.Engine.backward)
    assert "backward" not in vars(FastEngine) and "apply" not in vars(FastEngine)
    a = leaf([1.0, 2.0])
    b = a * 2.0
    c = (b + a).sum()
    order = graph.nodes(c)
    position = {id(node): i for i, node in enumerate(order)}
    assert order[0] is a and order[-1] is c.grad_fn and position[id(b.grad_fn)] < position[id(c.grad_fn.parents[0])]
    assert len(order) == len(position) == 4                          # a, Mul, Add, Sum: a once
    assert [id(n) for n in graph.ops(c)] == [id(n) for n in order[1:]]
    c.backward()
    assert graph.ops(c) == []                                         # freed by backward
