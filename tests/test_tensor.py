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
        assert not got.requires_grad and got._ctx is None
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
    y = tensor(x * 2)
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
