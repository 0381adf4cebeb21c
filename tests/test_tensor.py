"""The Tensor API: attributes, repr, comparisons and the methods that carry NumPy's names."""

import numpy as np
import pytest

import tinymlp
from tinymlp import Tensor, tensor


def arange(*shape, device="cpu", requires_grad=False):
    n = int(np.prod(shape))
    return tensor(np.arange(n, dtype=np.float32).reshape(shape), requires_grad=requires_grad, device=device)


def test_attributes(device):
    x = arange(2, 3, 4, device=device)
    assert x.shape == (2, 3, 4)
    assert x.ndim == 3 and x.size == 24 and len(x) == 2
    assert x.dtype == np.float32
    assert x.device == device
    assert not x.requires_grad and x.grad is None and x.is_leaf
    assert tensor(5.0).shape == () and tensor(5.0).ndim == 0 and tensor(5.0).size == 1


def test_len_of_a_0d_tensor_raises():
    with pytest.raises(TypeError):
        len(tensor(1.0))


def test_repr():
    assert repr(tensor([1.0, 2.0])) == "tensor([1. 2.])"
    assert repr(tensor([[0.5]], requires_grad=True)) == "tensor([[0.5]], requires_grad=True)"
    assert "dtype=float64" in repr(tensor(2.0, dtype="float64"))
    assert "dtype=int64" in repr(tensor([1, 2]))
    long = repr(tensor(np.arange(1000.0)))
    assert "..." in long and len(long) < 200  # large tensors are summarised


def test_comparisons_return_boolean_tensors_outside_the_graph(device):
    x = arange(2, 3, device=device, requires_grad=True)
    y = arange(2, 3, device=device) * 0 + 2
    expected = np.arange(6.0).reshape(2, 3)
    cases = [
        (x < 2, expected < 2), (x <= 2, expected <= 2), (x > 2, expected > 2),
        (x >= 2, expected >= 2), (x == 2, expected == 2), (x != 2, expected != 2),
        (x == y, expected == 2), (x > np.full(3, 1.0), expected > 1),
    ]
    for got, want in cases:
        assert isinstance(got, Tensor)
        assert got.dtype == np.bool_
        assert not got.requires_grad and got.grad_fn is None
        np.testing.assert_array_equal(got.numpy(), want)


def test_tensors_hash_by_identity():
    a, b = tensor([1.0]), tensor([1.0])
    assert len({a, b}) == 2 and {a: 1}[a] == 1


def test_argmax(device):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5))
    x = tensor(values, device=device, requires_grad=True)
    for axis in (None, 0, 1, -1):
        got = x.argmax(axis=axis)
        assert not got.requires_grad
        np.testing.assert_array_equal(got.numpy(), values.argmax(axis=axis))
    assert x.argmax().item() == values.argmax()


def test_data_is_always_an_array():
    """NumPy returns scalars from full reductions; a Tensor still holds an ndarray."""
    x = arange(2, 3)
    for t in (x.sum(), x.max(), x.mean(), x.argmax(), x.sum() > 1, x[0, 1]):
        assert isinstance(t.data, np.ndarray), type(t.data)


def test_T_swapaxes_flatten(device):
    values = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    x = tensor(values, device=device)
    np.testing.assert_array_equal(x.T.numpy(), values.T)
    np.testing.assert_array_equal(x.swapaxes(0, 2).numpy(), values.swapaxes(0, 2))
    np.testing.assert_array_equal(x.swapaxes(-1, 1).numpy(), values.swapaxes(-1, 1))
    np.testing.assert_array_equal(x.flatten().numpy(), values.reshape(-1))
    np.testing.assert_array_equal(x.flatten(1).numpy(), values.reshape(2, 12))


def test_bool_of_one_element():
    assert bool(tensor([1.0])) is True
    assert bool(tensor([[0.0]])) is False
    assert bool(tensor(3) > 2) is True
    with pytest.raises(ValueError, match="ambiguous"):
        bool(tensor([1.0, 2.0]))


def test_methods_with_numpy_names_and_conventions(device):
    values = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    x = tensor(values, device=device)
    checks = [
        (x.sum(axis=1, keepdims=True), values.sum(axis=1, keepdims=True)),
        (x.sum(), values.sum()),
        (x.sum(axis=(0, 2)), values.sum(axis=(0, 2))),
        (x.mean(axis=-1), values.mean(axis=-1)),
        (x.max(axis=0, keepdims=True), values.max(axis=0, keepdims=True)),
        (x.transpose(2, 0, 1), values.transpose(2, 0, 1)),
        (x.transpose((1, 0, 2)), values.transpose((1, 0, 2))),
        (x.transpose(), values.transpose()),
        (x.reshape(4, 6), values.reshape(4, 6)),
        (x.reshape((6, -1)), values.reshape((6, -1))),
        (x.reshape(-1), values.reshape(-1)),
        (x[1, :, ::2], values[1, :, ::2]),
        (x[..., -1], values[..., -1]),
        ((x / 10).exp(), np.exp(values / 10)),
        ((x + 1).log(), np.log(values + 1)),
        (x.sqrt(), np.sqrt(values)),
        ((x - 12).relu(), np.maximum(values - 12, 0)),
        ((x / 10).tanh(), np.tanh(values / 10)),
    ]
    for got, want in checks:
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_tolist_cpu_float_double():
    x = tensor([[1.0, 2.0]])
    assert x.tolist() == [[1.0, 2.0]]
    assert x.cpu() is x
    assert x.double().dtype == np.float64 and x.double().float().dtype == np.float32
    assert tensor([1, 2]).float().dtype == np.float32


def test_tensor_from_a_tensor_copies_no_graph():
    x = tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(TypeError, match="require grad"):       # it would be cut off its graph silently
        tensor(x * 2)
    y = tensor((x * 2).detach())
    assert y.is_leaf and not y.requires_grad
    np.testing.assert_array_equal(y.numpy(), [2.0, 4.0])


def test_module_level_functions_match_methods():
    x = arange(2, 3)
    np.testing.assert_array_equal(tinymlp.sum(x, axis=1).numpy(), x.sum(axis=1).numpy())
    np.testing.assert_array_equal(tinymlp.transpose(x).numpy(), x.T.numpy())
    np.testing.assert_array_equal(tinymlp.reshape(x, (3, 2)).numpy(), x.reshape(3, 2).numpy())
    np.testing.assert_array_equal(tinymlp.exp(x).numpy(), x.exp().numpy())


def test_np_asarray_reads_a_cpu_tensor_whole_and_refuses_a_gpu_one(device):
    x = arange(3, 4, device=device, requires_grad=True)
    if device != "cpu":
        with pytest.raises(TypeError, match=r"\.numpy\(\)"):
            np.asarray(x)
        return
    a = np.asarray(x)
    assert a is x.data                                   # shared, not read element by element
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    copied = np.array(x, copy=True)
    copied[0, 0] = 99.0
    assert x.data[0, 0] == 0.0
    assert (np.asarray(tensor([3, 0, 5])) != 0).tolist() == [True, False, True]


# ============================================================================ in-place operators
def test_in_place_update_under_no_grad_changes_the_parameter_itself():
    """The hand-written SGD step: p -= lr * p.grad changes the parameter the model holds."""
    from tinymlp import F, nn, no_grad

    layer = nn.Linear(3, 2, rng=0)
    x = tensor(np.random.default_rng(0).normal(size=(4, 3)))
    before = {name: p.data.copy() for name, p in layer.named_parameters()}
    F.cross_entropy(layer(x), np.array([0, 1, 1, 0])).backward()
    with no_grad():
        for p in layer.parameters():
            same = p
            p -= 0.5 * p.grad
            assert p is same                                   # the same object, not a new name
    for name, p in layer.named_parameters():
        np.testing.assert_allclose(p.data, before[name] - 0.5 * p.grad, rtol=1e-6)
    assert next(layer.parameters()) is layer.weight


@pytest.mark.parametrize("op, expected", [("+=", [3.0, 4.0]), ("-=", [-1.0, 0.0]), ("*=", [2.0, 4.0]),
                                          ("/=", [0.5, 1.0]), ("**=", [1.0, 4.0])])
def test_every_in_place_operator_writes_into_the_tensor(op, expected):
    t = tensor([1.0, 2.0])
    data = t.data
    namespace = {"t": t}
    exec(f"t {op} 2.0", namespace)
    assert namespace["t"] is t and t.data is data
    np.testing.assert_allclose(t.data, expected)


def test_item_assignment_under_no_grad_and_the_finite_difference_idiom():
    w = tensor(np.zeros((2, 3)), requires_grad=True)
    with tinymlp.no_grad():
        w[0, 1] += 0.25                     # w.__getitem__, then += on the element, then __setitem__
        w[1] = tensor([1.0, 2.0, 3.0])
        w[w > 2.5] = -1.0                   # a boolean mask given as a tensor
    np.testing.assert_array_equal(w.data, [[0.0, 0.25, 0.0], [1.0, 2.0, -1.0]])


def test_in_place_on_a_leaf_that_requires_grad_is_refused_outside_no_grad():
    w = tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=r"leaf tensor that requires grad .* `with tinymlp.no_grad\(\):`"):
        w -= 0.1
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w[0] = 5.0
    np.testing.assert_array_equal(w.data, [1.0, 2.0])      # refused before anything changed


def test_in_place_that_the_graph_would_have_to_record_is_refused():
    w = tensor([1.0, 2.0], requires_grad=True)
    h = w * 2.0                                          # inside the graph
    with pytest.raises(RuntimeError, match=r"not recorded by autograd .* x = x \+ y"):
        h += 1.0
    total = tensor(0.0)                                  # a constant accumulating a loss: the
    with pytest.raises(RuntimeError, match="not recorded by autograd"):  # gradient would be lost
        total += h.sum()


def test_in_place_results_must_fit_the_tensor():
    ids = tensor([1, 2, 3])
    with pytest.raises(TypeError, match=r"x \+= y in place, with x of shape \(3,\) \(int64\)"):
        ids += 0.5
    row = tensor([1.0, 2.0])
    with pytest.raises(ValueError, match=r"x \+= y .* of shape \(3, 2\).*fit x's shape"):
        row += np.ones((3, 2), dtype=np.float32)
    with pytest.raises(TypeError, match=r"x @= w: .* write x = x @ w"):
        row @= tensor(np.eye(2))


def test_an_in_place_change_of_a_saved_tensor_is_refused_at_backward():
    x = tensor(np.ones((2, 3)), requires_grad=True)
    w = tensor(np.ones((3, 2)), requires_grad=True)
    loss = (x @ w).sum()
    with tinymlp.no_grad():
        w *= 2.0
    with pytest.raises(RuntimeError, match=r"MatMul: input 1 'b'.*modified in place by an in-place operation"):
        loss.backward()


def test_a_write_through_a_view_reaches_the_tensor_it_views():
    x = tensor(np.ones((2, 3)), requires_grad=True)
    w = tensor(np.ones((3, 2)), requires_grad=True)
    loss = (x @ w).sum()
    with tinymlp.no_grad():
        row = w[0]                                       # a view of w's memory
        row += 1.0
    assert w.data[0, 0] == 2.0
    with pytest.raises(RuntimeError, match="modified in place"):
        loss.backward()


# ============================================================================ NumPy functions
def test_numpy_functions_refuse_to_drop_a_gradient_and_name_the_op_to_use():
    x = tensor([1.0, 2.0], requires_grad=True)
    cases = [(lambda: np.exp(x), r"tinymlp\.exp\(x\)"),
             (lambda: np.stack([x, x]), r"tinymlp\.stack"),
             (lambda: np.where(x.data > 1, x, 0.0), r"tinymlp\.where"),
             (lambda: np.sin(x), r"tinymlp\.Function"),
             (lambda: np.mean(x), r"x\.mean")]
    for call, message in cases:
        with pytest.raises(TypeError, match="would return a plain array and lose the gradient; .*" + message):
            call()


def test_numpy_functions_run_on_the_arrays_when_no_gradient_is_at_stake():
    x = tensor([1.0, 2.0], requires_grad=True)
    c = tensor([0.5, 3.0])
    np.testing.assert_allclose(np.exp(c), np.exp([0.5, 3.0]), rtol=1e-6)        # no grad involved
    with tinymlp.no_grad():
        assert isinstance(np.stack([x, x]), np.ndarray)                          # nothing recorded
    assert np.argmax(x) == 1 and np.allclose(x, [1.0, 2.0])                      # no float result
    assert np.isnan(x).dtype == np.bool_


def test_operators_between_arrays_and_tensors_stay_in_the_graph():
    x = tensor([1.0, 2.0], requires_grad=True)
    a = np.array([3.0, 4.0], dtype=np.float32)
    for y in (a * x, np.multiply(a, x), a + x * 0.0, a @ x):
        assert isinstance(y, Tensor) and y.requires_grad
    (a * x).sum().backward()
    np.testing.assert_allclose(x.grad, a)
    mask = a < x
    assert isinstance(mask, Tensor) and mask.dtype == np.bool_ and not mask.requires_grad
