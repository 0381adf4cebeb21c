"""Every primitive op: forward against plain NumPy, gradient against finite differences.

Hypothesis draws the *structure* (shapes, axes, indices) and a seed; the values come from
``np.random.default_rng(seed)``, so there are no exact zeros, ties or kinks unless a test asks
for them. Gradients are checked by ``tinymlp.gradcheck`` (central differences in float64 with a
random upstream gradient), never against the engine's own code path.
"""

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tinymlp
from tinymlp import gradcheck, tensor
from tinymlp.backend import to_device

# The `device` fixture only returns a device name, so sharing it across examples is safe.
with_device = settings(
    suppress_health_check=[*settings.default.suppress_health_check, HealthCheck.function_scoped_fixture]
)

SEEDS = st.integers(0, 2**32 - 1)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)
PAIRS = hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, min_side=1, max_side=4)
MATMUL_PAIRS = hnp.mutually_broadcastable_shapes(signature=np.matmul.signature, max_dims=2, max_side=3)


# ------------------------------------------------------------------ value generators
def normal(rng, shape):
    return rng.normal(size=shape)


def positive(rng, shape):
    return rng.uniform(0.5, 2.0, size=shape)


def away_from_zero(rng, shape):
    """|v| in [0.1, 2]: a step of 1e-6 never crosses the kink of relu at 0."""
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.1, 2.0, size=shape)


def distinct(rng, shape):
    """Values at least 0.3 apart: a max over them has no ties, even after a 1e-6 step."""
    size = int(np.prod(shape))
    return (rng.permutation(size) * 0.5 + rng.uniform(-0.1, 0.1, size=size)).reshape(shape)


def leaf(values, device, requires_grad=True):
    return tensor(values, requires_grad=requires_grad, dtype="float64", device=device)


def assert_forward(out, expected, rtol=1e-12):
    expected = np.asarray(expected)
    assert out.shape == expected.shape
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.numpy(), expected, rtol=rtol, atol=1e-14)


# ------------------------------------------------------------------ binary arithmetic
BINARY = {
    "add": (lambda a, b: a + b, normal, normal),
    "sub": (lambda a, b: a - b, normal, normal),
    "mul": (lambda a, b: a * b, normal, normal),
    "div": (lambda a, b: a / b, normal, away_from_zero),
    "pow": (lambda a, b: a**b, positive, normal),
    "tinymlp.add": (lambda a, b: tinymlp.add(a, b) if isinstance(a, tinymlp.Tensor) else a + b, normal, normal),
}


@pytest.mark.parametrize("name", BINARY)
@with_device
@given(shapes=PAIRS, seed=SEEDS, grads=st.sampled_from(["both", "first", "second"]))
@example(shapes=hnp.BroadcastableShapes(((1, 3), (4, 1)), (4, 3)), seed=0, grads="both")
@example(shapes=hnp.BroadcastableShapes(((1, 2, 3), (3,)), (1, 2, 3)), seed=1, grads="both")
def test_binary_op(name, device, shapes, seed, grads):
    op, make_a, make_b = BINARY[name]
    rng = np.random.default_rng(seed)
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    av, bv = make_a(rng, sa), make_b(rng, sb)
    a = leaf(av, device, requires_grad=grads in ("both", "first"))
    b = leaf(bv, device, requires_grad=grads in ("both", "second"))
    out = op(a, b)
    assert out.shape == out_shape
    assert_forward(out, op(av, bv))
    gradcheck(op, (a, b), seed=seed)


# ------------------------------------------------------------------ constants on either side
MIXED = {
    "2 - x": lambda x, c: 2 - x,
    "x - 2.5": lambda x, c: x - 2.5,
    "x / 3": lambda x, c: x / 3,
    "3 / x": lambda x, c: 3 / x,
    "1 + x": lambda x, c: 1 + x,
    "x ** 3": lambda x, c: x**3,
    "x ** 2": lambda x, c: x**2,
    "x ** -0.5": lambda x, c: x**-0.5,
    "2 ** x": lambda x, c: 2**x,
    "array * x": lambda x, c: c * x,
    "x * array": lambda x, c: x * c,
    "array - x": lambda x, c: c - x,
    "array / x": lambda x, c: c / x,
    "x / array": lambda x, c: x / c,
    "array ** x": lambda x, c: np.abs(c) ** x,
    "x ** array": lambda x, c: x**c,
    "x @ array": lambda x, c: x @ c[:, None],
    "x @ array (1-D)": lambda x, c: x @ c,
    "array @ x": lambda x, c: c @ x.T,
}


@pytest.mark.parametrize("name", MIXED)
@with_device
@given(shape=hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=4), seed=SEEDS)
def test_constants_mix_with_tensors_on_both_sides(name, device, shape, seed):
    fn = MIXED[name]
    rng = np.random.default_rng(seed)
    xv = positive(rng, shape)
    c = away_from_zero(rng, shape[-1:])  # a float64 NumPy array broadcasting over the rows
    x = leaf(xv, device)
    assert_forward(fn(x, c), fn(xv, c))
    gradcheck(lambda x: fn(x, c), (x,), seed=seed)


# ------------------------------------------------------------------ matmul
@with_device
@given(shapes=MATMUL_PAIRS, seed=SEEDS, grads=st.sampled_from(["both", "first", "second"]))
@example(shapes=hnp.BroadcastableShapes(((3,), (3,)), ()), seed=0, grads="both")
@example(shapes=hnp.BroadcastableShapes(((2,), (4, 2, 3)), (4, 3)), seed=0, grads="both")
@example(shapes=hnp.BroadcastableShapes(((4, 2, 3), (3,)), (4, 2)), seed=0, grads="both")
@example(shapes=hnp.BroadcastableShapes(((1, 2, 3), (5, 3, 2)), (5, 2, 2)), seed=0, grads="both")
@example(shapes=hnp.BroadcastableShapes(((5, 2, 3), (3, 2)), (5, 2, 2)), seed=0, grads="both")
def test_matmul(device, shapes, seed, grads):
    rng = np.random.default_rng(seed)
    (sa, sb), out_shape = shapes.input_shapes, shapes.result_shape
    av, bv = normal(rng, sa), normal(rng, sb)
    a = leaf(av, device, requires_grad=grads in ("both", "first"))
    b = leaf(bv, device, requires_grad=grads in ("both", "second"))
    out = a @ b
    assert out.shape == out_shape
    assert_forward(out, av @ bv, rtol=1e-10)
    assert_forward(tinymlp.matmul(a, b), av @ bv, rtol=1e-10)
    gradcheck(lambda a, b: a @ b, (a, b), seed=seed)


# ------------------------------------------------------------------ unary elementwise
UNARY = {
    "neg": (lambda x: -x, np.negative, normal),
    "exp": (tinymlp.exp, np.exp, normal),
    "log": (tinymlp.log, np.log, positive),
    "sqrt": (tinymlp.sqrt, np.sqrt, positive),
    "tanh": (tinymlp.tanh, np.tanh, normal),
    "sigmoid": (tinymlp.sigmoid, lambda v: 1 / (1 + np.exp(-v)), lambda rng, s: 4 * rng.normal(size=s)),
    "relu": (tinymlp.relu, lambda v: np.maximum(v, 0), away_from_zero),
    "x.exp()": (lambda x: x.exp(), np.exp, normal),
    "x.log()": (lambda x: x.log(), np.log, positive),
    "x.relu()": (lambda x: x.relu(), lambda v: np.maximum(v, 0), away_from_zero),
    "x.sigmoid()": (lambda x: x.sigmoid(), lambda v: 1 / (1 + np.exp(-v)), normal),
}


@pytest.mark.parametrize("name", UNARY)
@with_device
@given(shape=SHAPES, seed=SEEDS)
@example(shape=(1, 3), seed=0)
def test_unary_op(name, device, shape, seed):
    op, reference, make = UNARY[name]
    rng = np.random.default_rng(seed)
    xv = make(rng, shape)
    x = leaf(xv, device)
    assert_forward(op(x), reference(xv), rtol=1e-10)
    gradcheck(op, (x,), seed=seed)


def test_relu_kink_and_max_ties_use_the_documented_subgradients():
    x = tensor([-1.0, 0.0, 2.0], requires_grad=True)
    x.relu().sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0, 1.0])  # 0 at the kink
    y = tensor([1.0, 3.0, 3.0], requires_grad=True)
    y.max().backward()
    np.testing.assert_array_equal(y.grad, [0.0, 0.5, 0.5])  # ties share the gradient


def test_sigmoid_is_stable_for_large_inputs():
    x = tensor([-800.0, 0.0, 800.0], dtype="float64", requires_grad=True)
    y = x.sigmoid()
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.5, 1.0])
    y.sum().backward()
    assert np.all(np.isfinite(x.grad))


# ------------------------------------------------------------------ reductions
@st.composite
def shape_and_axis(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    ndim = len(shape)
    axis = draw(st.none() | st.integers(-ndim, ndim - 1) | hnp.valid_tuple_axes(ndim))
    return shape, axis


REDUCTIONS = {
    "sum": (lambda x, **kw: x.sum(**kw), np.sum, normal),
    "mean": (lambda x, **kw: x.mean(**kw), np.mean, normal),
    "max": (lambda x, **kw: x.max(**kw), np.max, distinct),
    "tinymlp.sum": (lambda x, **kw: tinymlp.sum(x, **kw), np.sum, normal),
    "tinymlp.max": (lambda x, **kw: tinymlp.max(x, **kw), np.max, distinct),
}


@pytest.mark.parametrize("name", REDUCTIONS)
@with_device
@given(shape_axis=shape_and_axis(), keepdims=st.booleans(), seed=SEEDS)
@example(shape_axis=((1, 4), 1), keepdims=False, seed=0)
@example(shape_axis=((2, 3, 4), (0, -1)), keepdims=True, seed=0)
def test_reduction(name, device, shape_axis, keepdims, seed):
    op, reference, make = REDUCTIONS[name]
    shape, axis = shape_axis
    rng = np.random.default_rng(seed)
    xv = make(rng, shape)
    x = leaf(xv, device)
    assert_forward(op(x, axis=axis, keepdims=keepdims), reference(xv, axis=axis, keepdims=keepdims))
    gradcheck(lambda x: op(x, axis=axis, keepdims=keepdims), (x,), seed=seed)


# ------------------------------------------------------------------ reshape / transpose
@st.composite
def shape_and_new_shape(draw):
    shape = draw(SHAPES)
    target = list(draw(st.permutations(shape)))
    for _ in range(draw(st.integers(0, 2))):
        target.insert(draw(st.integers(0, len(target))), 1)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return shape, tuple(target)


@with_device
@given(shapes=shape_and_new_shape(), seed=SEEDS)
def test_reshape(device, shapes, seed):
    shape, new_shape = shapes
    xv = normal(np.random.default_rng(seed), shape)
    x = leaf(xv, device)
    assert_forward(x.reshape(new_shape), xv.reshape(new_shape))
    assert_forward(tinymlp.reshape(x, new_shape), xv.reshape(new_shape))
    gradcheck(lambda x: x.reshape(*new_shape), (x,), seed=seed)


@st.composite
def shape_and_axes(draw):
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=3))
    ndim = len(shape)
    if draw(st.booleans()):
        return shape, None
    perm = draw(st.permutations(range(ndim)))
    negative = draw(st.lists(st.booleans(), min_size=ndim, max_size=ndim))
    return shape, tuple(a - ndim if neg else a for a, neg in zip(perm, negative))


@with_device
@given(shape_axes=shape_and_axes(), seed=SEEDS)
def test_transpose(device, shape_axes, seed):
    shape, axes = shape_axes
    xv = normal(np.random.default_rng(seed), shape)
    x = leaf(xv, device)
    assert_forward(x.transpose(axes), xv.transpose(axes))
    assert_forward(tinymlp.transpose(x, axes), np.transpose(xv, axes))
    gradcheck(lambda x: tinymlp.transpose(x, axes), (x,), seed=seed)


# ------------------------------------------------------------------ indexing
def _check_index(x, xv, index, seed, numpy_index=None):
    out = x[index]
    assert_forward(out, xv[index if numpy_index is None else numpy_index])
    if out.size == 0:  # nothing selected: the gradient is exactly zero
        out.backward(np.zeros(out.shape))
        np.testing.assert_array_equal(to_device(x.grad, "cpu"), np.zeros(x.shape))
    else:
        gradcheck(lambda x: x[index], (x,), seed=seed)


@with_device
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=SEEDS)
def test_basic_indexing(device, data, shape, seed):
    """Integers, slices (negative steps too), Ellipsis and None."""
    index = data.draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True), label="index")
    xv = normal(np.random.default_rng(seed), shape)
    _check_index(leaf(xv, device), xv, index, seed)


@with_device
@given(data=st.data(), shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=SEEDS)
def test_integer_array_indexing(device, data, shape, seed):
    """Advanced indexing; repeated indices must have their gradients summed."""
    index = data.draw(hnp.integer_array_indices(shape, result_shape=hnp.array_shapes(max_dims=2, max_side=5)))
    xv = normal(np.random.default_rng(seed), shape)
    _check_index(leaf(xv, device), xv, index, seed)


@with_device
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=SEEDS, axis=st.integers(0, 2))
def test_repeated_indices_along_an_axis(device, shape, seed, axis):
    rng = np.random.default_rng(seed)
    axis = axis % len(shape)
    n = shape[axis]
    idx = rng.integers(0, n, size=3)
    idx = np.concatenate([idx, idx[:1], [-1]])  # at least one repeat, one negative index
    index = (slice(None),) * axis + (idx,)
    xv = normal(rng, shape)
    _check_index(leaf(xv, device), xv, index, seed)


@with_device
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4), seed=SEEDS, data=st.data())
def test_boolean_mask_indexing(device, shape, seed, data):
    rng = np.random.default_rng(seed)
    k = data.draw(st.integers(1, len(shape)), label="mask dims")
    mask = rng.random(shape[:k]) < 0.5
    xv = normal(rng, shape)
    _check_index(leaf(xv, device), xv, mask, seed)
    x = leaf(xv, device)
    _check_index(x, xv, tensor(mask, device=device), seed, numpy_index=mask)  # a boolean Tensor as the mask


def test_repeated_index_gradient_is_summed(device):
    x = tensor([10.0, 20.0, 30.0], requires_grad=True, device=device)
    x[[0, 0, 2, 0]].backward(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(tinymlp.tensor(x.grad).numpy(), [7.0, 0.0, 3.0])
    y = tensor(np.arange(6.0).reshape(2, 3), requires_grad=True, device=device)
    y[tensor([1, 1], device=device)].sum().backward()  # an integer Tensor as the index
    np.testing.assert_array_equal(tinymlp.tensor(y.grad).numpy(), [[0, 0, 0], [2, 2, 2]])


# ------------------------------------------------------------------ joining and splitting
@st.composite
def concat_case(draw):
    base = list(draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)))
    axis = draw(st.integers(-len(base), len(base) - 1))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    shapes = []
    for s in sizes:
        shape = list(base)
        shape[axis] = s
        shapes.append(tuple(shape))
    return shapes, axis


@with_device
@given(case=concat_case(), seed=SEEDS)
def test_concatenate(device, case, seed):
    shapes, axis = case
    rng = np.random.default_rng(seed)
    values = [normal(rng, s) for s in shapes]
    tensors = tuple(leaf(v, device) for v in values)
    assert_forward(tinymlp.concatenate(tensors, axis=axis), np.concatenate(values, axis=axis))
    gradcheck(lambda *ts: tinymlp.concatenate(ts, axis=axis), tensors, seed=seed)


def test_concatenate_with_a_constant_tensor(device):
    a = tensor([1.0, 2.0], requires_grad=True, device=device)
    b = tensor([5.0], device=device)
    tinymlp.concatenate([b, a, b]).backward(np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(tinymlp.tensor(a.grad).numpy(), [2.0, 3.0])
    assert b.grad is None


@st.composite
def split_case(draw):
    shape = list(draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=3)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    if draw(st.booleans()):
        sections = draw(st.integers(1, 3))
        shape[axis] *= sections
        return tuple(shape), sections, axis
    shape[axis] = draw(st.integers(1, 6))
    bounds = sorted(draw(st.lists(st.integers(0, shape[axis]), max_size=3)))
    return tuple(shape), bounds, axis


@with_device
@given(case=split_case(), seed=SEEDS)
def test_split(device, case, seed):
    shape, sections, axis = case
    xv = normal(np.random.default_rng(seed), shape)
    x = leaf(xv, device)
    pieces, expected = tinymlp.split(x, sections, axis=axis), np.split(xv, sections, axis=axis)
    assert len(pieces) == len(expected)
    for piece, want in zip(pieces, expected):
        assert_forward(piece, want)
    nonempty = [i for i, p in enumerate(expected) if p.size]
    gradcheck(lambda x: tuple(tinymlp.split(x, sections, axis=axis)[i] for i in nonempty), (x,), seed=seed)


def test_split_rejects_unequal_sections():
    with pytest.raises(ValueError, match="split"):
        tinymlp.split(tensor(np.zeros((5, 2))), 2)


@with_device
@given(
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3),
    count=st.integers(1, 3),
    data=st.data(),
    seed=SEEDS,
)
def test_stack(device, shape, count, data, seed):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)), label="axis")
    rng = np.random.default_rng(seed)
    values = [normal(rng, shape) for _ in range(count)]
    tensors = tuple(leaf(v, device) for v in values)
    assert_forward(tinymlp.stack(tensors, axis=axis), np.stack(values, axis=axis))
    gradcheck(lambda *ts: tinymlp.stack(ts, axis=axis), tensors, seed=seed)


# ------------------------------------------------------------------ where, astype
@with_device
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3),
    seed=SEEDS,
    grads=st.sampled_from(["both", "first", "second"]),
)
def test_where(device, shapes, seed, grads):
    sc, sa, sb = shapes.input_shapes
    rng = np.random.default_rng(seed)
    cond, av, bv = rng.random(sc) < 0.5, normal(rng, sa), normal(rng, sb)
    a = leaf(av, device, requires_grad=grads in ("both", "first"))
    b = leaf(bv, device, requires_grad=grads in ("both", "second"))
    assert_forward(tinymlp.where(cond, a, b), np.where(cond, av, bv))
    gradcheck(lambda a, b: tinymlp.where(cond, a, b), (a, b), seed=seed)


@with_device
@given(shape=SHAPES, seed=SEEDS)
def test_where_with_a_scalar_branch_and_a_tensor_condition(device, shape, seed):
    xv = away_from_zero(np.random.default_rng(seed), shape)
    x = leaf(xv, device)
    assert_forward(tinymlp.where(x > 0, x, 0.0), np.where(xv > 0, xv, 0.0))
    assert_forward(tinymlp.where(x > 0, -1.0, x), np.where(xv > 0, -1.0, xv))
    gradcheck(lambda x: tinymlp.where(x > 0, x * 3.0, 0.5), (x,), seed=seed)
    gradcheck(lambda x: tinymlp.where(x.data > 0, 0.5, x), (x,), seed=seed)


@pytest.mark.parametrize("src, dst", [("float32", "float64"), ("float64", "float32"), ("float64", "float64")])
def test_astype_gradient_comes_back_in_the_input_dtype(device, src, dst):
    rng = np.random.default_rng(0)
    x = tensor(rng.normal(size=(2, 3)), dtype=src, requires_grad=True, device=device)
    y = x.astype(dst)
    assert y.dtype == np.dtype(dst) and y.requires_grad
    np.testing.assert_array_equal(y.numpy(), x.numpy().astype(dst))
    g = rng.normal(size=(2, 3))
    (y * tensor(g, dtype=dst, device=device)).sum().backward()
    grad = tinymlp.tensor(x.grad, dtype=src).numpy()
    assert x.grad.dtype == np.dtype(src)
    np.testing.assert_allclose(grad, g.astype(dst).astype(src), rtol=1e-6)


@with_device
@given(shape=SHAPES, seed=SEEDS)
def test_astype_in_a_float64_chain(device, shape, seed):
    x = leaf(normal(np.random.default_rng(seed), shape), device)
    gradcheck(lambda x: tinymlp.astype(x, "float64") * x.astype(np.float64), (x,), seed=seed)


def test_getitem_function_sums_gradients_of_repeated_indices():
    """GetItem directly: row 1 picked three times gets three times the upstream gradient."""
    from tinymlp.ops.shape import GetItem

    x = tinymlp.tensor(np.random.default_rng(0).normal(size=(4, 3)), dtype="float64", requires_grad=True)
    index = np.array([1, 3, 1, 1])
    gradcheck(lambda t: GetItem.apply(t, index), (x,))
    GetItem.apply(x, index).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0, 0], [3, 3, 3], [0, 0, 0], [1, 1, 1]])
