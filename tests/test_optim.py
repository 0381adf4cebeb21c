"""Tests of tinymlp.optim: updates against hand computations, param groups, schedules, clipping."""

import math
import tracemalloc

import numpy as np
import pytest

import tinymlp
import tinymlp.nn
from tinymlp.optim import (
    SGD, Adam, AdamW, WarmupCosine, WarmupLinear, clip_grad_norm, param_groups,
)

pytestmark = pytest.mark.usefixtures("tier")   # every test on the fast and the reference tier

P0 = [1.0, -2.0]
G1 = [0.5, 1.0]
G2 = [-1.0, 0.25]


def param(values, dtype="float64", device="cpu"):
    return tinymlp.tensor(np.array(values), requires_grad=True, dtype=dtype, device=device)  # a copy


def two_steps(opt, p, grads=(G1, G2)):
    for g in grads:
        p.grad = np.asarray(g, dtype=p.dtype)
        opt.step()
    return p.data


# ---------------------------------------------------------------------- updates by hand
@pytest.mark.parametrize("kwargs, expected", [
    # plain: p - 0.1 g1 = [0.95, -2.1];  then p - 0.1 g2
    (dict(), [1.05, -2.125]),
    # momentum 0.9: b1 = g1, p1 = [0.95, -2.1];  b2 = 0.9 g1 + g2 = [-0.55, 1.15]
    (dict(momentum=0.9), [1.005, -2.215]),
    # nesterov: d1 = g1 + 0.9 g1 = [0.95, 1.9], p1 = [0.905, -2.19];  d2 = g2 + 0.9 b2 = [-1.495, 1.285]
    (dict(momentum=0.9, nesterov=True), [1.0545, -2.3185]),
    # weight decay 0.1: g1' = g1 + 0.1 p0 = [0.6, 0.8], p1 = [0.94, -2.08];  g2' = [-0.906, 0.042]
    (dict(weight_decay=0.1), [1.0306, -2.0842]),
])
def test_sgd_two_steps_by_hand(kwargs, expected):
    p = param(P0)
    np.testing.assert_allclose(two_steps(SGD([p], lr=0.1, **kwargs), p), expected, rtol=0, atol=1e-12)


def adam_reference(p, grads, lr, b1, b2, eps, wd, decoupled):
    """Adam / AdamW written out on Python floats, element by element, textbook order."""
    p = list(p)
    m = [0.0] * len(p)
    v = [0.0] * len(p)
    for t, g in enumerate(grads, start=1):
        for j in range(len(p)):
            gj = g[j]
            if decoupled:
                p[j] -= lr * wd * p[j]
            else:
                gj += wd * p[j]
            m[j] = b1 * m[j] + (1 - b1) * gj
            v[j] = b2 * v[j] + (1 - b2) * gj * gj
            m_hat = m[j] / (1 - b1**t)
            v_hat = v[j] / (1 - b2**t)
            p[j] -= lr * m_hat / (math.sqrt(v_hat) + eps)
    return p


def test_adam_first_step_is_lr_times_sign():
    # m_hat = g and v_hat = g^2 at t = 1, so the first step is lr * g / (|g| + eps)
    p = param(P0)
    opt = Adam([p], lr=0.1)
    p.grad = np.asarray(G1)
    opt.step()
    np.testing.assert_allclose(p.data, [0.9, -2.1], rtol=0, atol=1e-8)


@pytest.mark.parametrize("cls, decoupled", [(Adam, False), (AdamW, True)])
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_adamw_two_steps(cls, decoupled, wd):
    p = param(P0)
    opt = cls([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    expected = adam_reference(P0, [G1, G2], 0.1, 0.9, 0.999, 1e-8, wd, decoupled)
    np.testing.assert_allclose(two_steps(opt, p), expected, rtol=1e-13, atol=1e-13)


def test_adam_and_adamw_differ_with_weight_decay():
    a, b = param(P0), param(P0)
    two_steps(Adam([a], lr=0.1, weight_decay=0.1), a)
    two_steps(AdamW([b], lr=0.1, weight_decay=0.1), b)
    assert np.abs(a.data - b.data).max() > 1e-3


def test_matches_torch_over_several_steps():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (4,), (2, 3, 5), (1,)]
    init = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) for s in shapes] for _ in range(5)]
    grads[2][1] = None  # a missing gradient: that parameter skips the step (and its count)
    cases = [
        (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
        (Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
        (AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
    ]
    for ours_cls, torch_cls, kwargs in cases:
        ours = [param(a) for a in init]
        theirs = [torch.tensor(a, requires_grad=True) for a in init]
        opt_a = ours_cls([{"params": ours[:2]}, {"params": ours[2:], "lr": 0.05}], **kwargs)
        opt_b = torch_cls([{"params": theirs[:2]}, {"params": theirs[2:], "lr": 0.05}], **kwargs)
        for step in grads:
            for p, q, g in zip(ours, theirs, step):
                p.grad = None if g is None else g.copy()
                q.grad = None if g is None else torch.tensor(g)
            opt_a.step()
            opt_b.step()
        for p, q in zip(ours, theirs):
            np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-12, atol=1e-12, err_msg=ours_cls.__name__)


def test_flat_path_equals_per_parameter_path():
    """Parameters at different steps (after a missing gradient) take the per-parameter path."""
    rng = np.random.default_rng(1)
    shapes = [(70, 1000), (5,), (300, 300)]  # bigger than one CPU piece of the flat buffers
    init = [rng.standard_normal(s) for s in shapes]
    params = [param(a) for a in init]
    opt = AdamW(params, lr=0.01, weight_decay=0.1)
    history = []
    for step in range(4):
        grads = [rng.standard_normal(s) for s in shapes]
        if step == 1:
            grads[1] = None
        history.append(grads)
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
    for j, a in enumerate(init):  # a vectorised float64 reference, parameter by parameter
        p, m, v, t = a.copy(), 0.0, 0.0, 0
        for h in history:
            g = h[j]
            if g is None:
                continue
            t += 1
            p -= 0.01 * 0.1 * p
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            p -= 0.01 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        np.testing.assert_allclose(params[j].data, p, rtol=1e-12, atol=1e-12)
    assert [s["step"] for s in opt.state[0]] == [4, 3, 4]


def test_the_whole_adamw_step_over_many_parameters_matches_the_formula(tier, monkeypatch):
    """More parameters than one launch of the compiled whole step takes (``optim_numba.BATCH``),
    of many sizes: every one gets AdamW's update, on both tiers (the fast CPU tier in that one
    pass per batch of parameters, where numba is installed)."""
    rng = np.random.default_rng(2)
    shapes = [(int(rng.integers(1, 40)), int(rng.integers(1, 9))) for _ in range(37)] + [(300, 500)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [param(a, dtype="float32") for a in init]
    opt = AdamW(params, lr=0.01, weight_decay=0.1)
    from tinymlp.fast import compiled
    from tinymlp.fast.kernels import optim_numba
    whole = []
    step = optim_numba.adam_step
    monkeypatch.setattr(optim_numba, "adam_step", lambda *a: whole.append(step(*a)) or whole[-1])
    history = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    for grads in history:
        for p, g in zip(params, grads):
            p.grad = g
        opt.step()
    for j, a in enumerate(init):                  # AdamW in float64, parameter by parameter
        p, m, v = a.astype(np.float64), 0.0, 0.0
        for t, h in enumerate(history, start=1):
            g = h[j].astype(np.float64)
            p -= 0.01 * 0.1 * p
            m = 0.9 * m + 0.1 * g
            v = 0.999 * v + 0.001 * g * g
            p -= 0.01 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        np.testing.assert_allclose(params[j].data, p, rtol=2e-5, atol=2e-6)
    assert [s["step"] for s in opt.state[0]] == [3] * len(shapes)
    if tier == "fast" and compiled.is_enabled():
        assert whole == [True] * 3, "the compiled whole step did not run"


# ---------------------------------------------------------------------- param groups
def test_param_groups_exempt_biases_and_norms():
    rng = np.random.default_rng(0)
    named = {
        "fc.weight": param(rng.standard_normal((3, 4))),
        "fc.bias": param(rng.standard_normal(4)),
        "norm.weight": param(rng.standard_normal(4)),
        "token_norm.scale2d": param(rng.standard_normal((2, 4))),  # exempt by name
        "spatial.weight": param(rng.standard_normal((4, 4))),
    }
    groups = param_groups(named, weight_decay=0.5)
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]
    assert {id(p) for p in groups[0]["params"]} == {id(named["fc.weight"]), id(named["spatial.weight"])}
    assert len(groups[1]["params"]) == 3

    before = {k: p.data.copy() for k, p in named.items()}
    opt = AdamW(groups, lr=0.1)
    for p in named.values():
        p.grad = np.zeros_like(p.data)  # zero gradient: only the decay moves anything
    opt.step()
    for k, p in named.items():
        factor = 1 - 0.1 * 0.5 if k in ("fc.weight", "spatial.weight") else 1.0
        np.testing.assert_allclose(p.data, before[k] * factor, rtol=1e-15, atol=0, err_msg=k)


def test_param_groups_from_module_and_per_group_lr():
    lin = tinymlp.nn.Linear(3, 2, rng=0)
    groups = param_groups(lin, weight_decay=0.1)
    assert [len(g["params"]) for g in groups] == [1, 1]
    groups[1]["lr"] = 0.5
    opt = SGD(groups, lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    w, b = lin.weight.data.copy(), lin.bias.data.copy()
    lin.weight.grad = np.ones_like(w)
    lin.bias.grad = np.ones_like(b)
    opt.step()
    np.testing.assert_allclose(lin.weight.data, w - 0.1 * (1 + 0.1 * w), rtol=1e-6)
    np.testing.assert_allclose(lin.bias.data, b - 0.5, rtol=1e-6)
    opt.lr = 0.01
    assert opt.lr == 0.01 and [g["lr"] for g in opt.param_groups] == [0.01, 0.01]


# ---------------------------------------------------------------------- no graph, dtypes, memory
@pytest.mark.parametrize("make", [
    lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
    lambda ps: Adam(ps, weight_decay=0.1),
    lambda ps: AdamW(ps),
])
def test_step_builds_no_graph_and_leaves_grads_alone(make):
    rng = np.random.default_rng(0)
    ps = [param(rng.standard_normal(s), dtype="float32") for s in [(4, 3), (3,)]]
    loss = ((ps[0] * 2.0).sum() + ps[1].sum())
    loss.backward()
    grads = [p.grad for p in ps]
    copies = [g.copy() for g in grads]
    datas = [p.data for p in ps]
    make(ps).step()
    for p, g, c, d in zip(ps, grads, copies, datas):
        assert p.grad_fn is None and p.is_leaf and p.requires_grad
        assert p.grad is g and np.array_equal(g, c)
        assert p.data is d  # updated in place
        assert p.data.dtype == np.float32


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_float32_stays_float32_and_steps_allocate_nothing(cls, tier):
    """On the fast tier a step allocates nothing after the first; on both float32 stays float32."""
    rng = np.random.default_rng(0)
    ps = [param(rng.standard_normal(s), dtype="float32") for s in [(300, 400), (400,), (64, 64)]]
    opt = cls(ps, lr=0.01, weight_decay=0.1, **({"momentum": 0.9} if cls is SGD else {}))
    for p in ps:
        p.grad = rng.standard_normal(p.shape).astype(np.float32)
    opt.step()  # the first step allocates the state
    tracemalloc.start()
    opt.step()
    opt.step()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    nbytes = sum(p.data.nbytes for p in ps)
    if tier == "fast":
        assert peak < nbytes / 20, f"an optimizer step allocated {peak} bytes (parameters: {nbytes})"
        fs = opt.flat_state[0]
        assert all(b.dtype == np.float32 for b in [fs.grad, fs.work, *fs.bufs.values()])
    assert all(p.data.dtype == np.float32 for p in ps)
    assert all(a.dtype == np.float32 for s in opt.state[0] for k, a in s.items() if k != "step")
    assert all(a.dtype == np.float32 for e in opt.state_dict()["state"].values() for k, a in e.items() if k != "step")


def test_state_follows_a_change_of_dtype():
    p = param(P0, dtype="float32")
    opt = Adam([p], lr=0.1)
    two_steps(opt, p, [G1])
    p.data = p.data.astype(np.float64)
    two_steps(opt, p, [G2])
    assert p.data.dtype == np.float64 and opt.state[0][0]["exp_avg"].dtype == np.float64
    np.testing.assert_allclose(p.data, adam_reference(P0, [G1, G2], 0.1, 0.9, 0.999, 1e-8, 0, False), rtol=1e-6)


# ---------------------------------------------------------------------- state dicts
@pytest.mark.parametrize("make", [
    lambda ps: SGD([{"params": ps[:1]}, {"params": ps[1:], "momentum": 0.5}], lr=0.1, momentum=0.9),
    lambda ps: Adam(ps, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1),
    lambda ps: AdamW(param_groups({"w": ps[0], "b": ps[1], "v": ps[2]}, 0.1), lr=0.01),
])
def test_state_dict_round_trip(make):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in [(5, 3), (3,), (2, 2)]]
    grads = [[rng.standard_normal(a.shape).astype(np.float32) for a in init] for _ in range(5)]
    a_ps = [param(x, dtype="float32") for x in init]
    opt_a = make(a_ps)
    for step in grads[:3]:
        for p, g in zip(a_ps, step):
            p.grad = g
        opt_a.step()
    sd = opt_a.state_dict()
    for entry in sd["state"].values():
        assert isinstance(entry["step"], int)
        assert all(isinstance(v, np.ndarray) for k, v in entry.items() if k != "step")
    b_ps = [param(p.data.copy(), dtype="float32") for p in a_ps]
    opt_b = make(b_ps)
    opt_b.lr = 123.0  # overwritten by the loaded hyperparameters
    opt_b.load_state_dict(sd)
    for entry in sd["state"].values():  # the optimizer copied the arrays: this changes nothing
        for k, v in entry.items():
            if k != "step":
                v *= 0
    for step in grads[3:]:
        for pa, pb, g in zip(a_ps, b_ps, step):
            pa.grad, pb.grad = g, g.copy()
        opt_a.step()
        opt_b.step()
    for pa, pb in zip(a_ps, b_ps):
        assert np.array_equal(pa.data, pb.data)  # bitwise


def test_load_state_dict_errors_leave_the_optimizer_alone():
    ps = [param(np.ones((2, 3))), param(np.ones(3))]
    opt = Adam(ps, lr=0.1)
    for p in ps:
        p.grad = np.ones_like(p.data)
    opt.step()
    sd = opt.state_dict()
    other = Adam([param(np.ones((3, 2))), param(np.ones(3))], lr=0.5)
    with pytest.raises(ValueError, match=r"exp_avg has shape \(2, 3\), parameter \(3, 2\)"):
        other.load_state_dict(sd)
    assert other.lr == 0.5 and other.state == [[None, None]]
    with pytest.raises(ValueError, match="1 param group"):
        Adam([{"params": ps[:1]}, {"params": ps[1:]}]).load_state_dict(sd)
    sgd = SGD([param(np.ones((2, 3))), param(np.ones(3))], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="momentum_buffer"):
        sgd.load_state_dict(sd)


def test_constructor_errors():
    with pytest.raises(ValueError, match="empty"):
        SGD([], lr=0.1)
    p = param(P0)
    with pytest.raises(ValueError, match="twice"):
        SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="nesterov"):
        SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="Tensors"):
        AdamW([np.zeros(3)])
    mixed = AdamW([param(P0, dtype="float32"), param(P0, dtype="float64")], lr=0.1)
    for q in mixed.param_groups[0]["params"]:   # a group of mixed dtypes is updated one by one
        q.grad = np.ones_like(q.data)
    mixed.step()
    a, b = mixed.param_groups[0]["params"]
    assert a.dtype == np.float32 and b.dtype == np.float64
    np.testing.assert_allclose(a.data, b.data, rtol=1e-6)


def test_on_device_matches_cpu(device):
    rng = np.random.default_rng(0)
    init = rng.standard_normal((20, 30)).astype(np.float32)
    grads = [rng.standard_normal((20, 30)).astype(np.float32) for _ in range(3)]
    results = []
    for dev in ("cpu", device):
        p = param(init, dtype="float32", device=dev)
        opt = AdamW([p], lr=0.01, weight_decay=0.1)
        for g in grads:
            p.grad = tinymlp.tensor(g, device=dev).data
            opt.step()
        results.append(p.numpy())
    np.testing.assert_allclose(results[1], results[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- schedules
def make_sched(cls, warmup=10, total=110, min_lr=0.01):
    opt = SGD([{"params": [param(P0)]}, {"params": [param(P0)], "lr": 0.1}], lr=1.0)
    return opt, cls(opt, warmup_steps=warmup, total_steps=total, min_lr=min_lr)


@pytest.mark.parametrize("cls, middle, quarter", [
    (WarmupLinear, 0.01 + 0.99 * 0.5, 0.01 + 0.99 * 0.75),
    (WarmupCosine, 0.01 + 0.99 * 0.5, 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi / 4))),
])
def test_schedules_at_key_steps(cls, middle, quarter):
    opt, sched = make_sched(cls)
    assert opt.lr == 0.0 and sched.get_lr(0) == 0.0  # warmup starts at 0
    assert sched.get_lr(5) == pytest.approx(0.5)
    assert sched.get_lr(10) == pytest.approx(1.0)  # end of warmup: the base lr
    assert sched.get_lr(35) == pytest.approx(quarter)
    assert sched.get_lr(60) == pytest.approx(middle)
    assert sched.get_lr(110) == pytest.approx(0.01)  # end: min_lr
    assert sched.get_lr(500) == pytest.approx(0.01)
    lrs = []
    for _ in range(60):
        opt.step()
        sched.step()
        lrs.append([g["lr"] for g in opt.param_groups])
    assert lrs[9][0] == pytest.approx(1.0) and lrs[9][1] == pytest.approx(0.1)  # after 10 steps
    assert lrs[59][0] == pytest.approx(middle) and sched.step_count == 60
    assert lrs[59][1] == pytest.approx(0.01 + (0.1 - 0.01) * (middle - 0.01) / 0.99)


def test_schedule_without_warmup_and_state_dict():
    opt, sched = make_sched(WarmupLinear, warmup=0, total=100, min_lr=0.0)
    assert opt.lr == 1.0 and sched.get_lr(50) == pytest.approx(0.5)
    for _ in range(30):
        sched.step()
    sd = sched.state_dict()
    opt2, sched2 = make_sched(WarmupLinear, warmup=0, total=100, min_lr=0.0)
    opt2.lr = 7.0
    sched2.load_state_dict(sd)
    assert sched2.step_count == 30 and [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupCosine(opt, warmup_steps=20, total_steps=10)


# ---------------------------------------------------------------------- clipping
def test_clip_grad_norm():
    rng = np.random.default_rng(0)
    ps = [param(np.zeros(s), dtype="float32") for s in [(30, 40), (40,), (7,)]]
    for p in ps[:2]:
        p.grad = rng.standard_normal(p.shape).astype(np.float32)
    expected = math.sqrt(sum(float((p.grad.astype(np.float64) ** 2).sum()) for p in ps[:2]))
    before = [p.grad.copy() for p in ps[:2]]

    total = clip_grad_norm(ps, max_norm=1e6)  # below the limit: nothing changes
    assert isinstance(total, float) and total == pytest.approx(expected, rel=1e-6)
    assert all(np.array_equal(p.grad, b) for p, b in zip(ps, before))

    total = clip_grad_norm(ps, max_norm=2.0)
    assert total == pytest.approx(expected, rel=1e-6)
    after = math.sqrt(sum(float((p.grad.astype(np.float64) ** 2).sum()) for p in ps[:2]))
    assert after == pytest.approx(2.0, rel=1e-5)
    assert all(p.grad.dtype == np.float32 for p in ps[:2]) and ps[2].grad is None
    np.testing.assert_allclose(ps[0].grad, before[0] * (2.0 / expected), rtol=1e-5)
    assert clip_grad_norm([param(P0)], 1.0) == 0.0  # no gradients at all


@pytest.mark.parametrize("max_norm", [1e6, 2.0])
def test_clip_grad_norm_without_sync_matches_the_host_decision(max_norm):
    """sync=False keeps the decision on the device (a 0-d array, no float()); same result."""
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(30, 40), (40,)]]
    host = [param(np.zeros(g.shape), dtype="float32") for g in grads]
    device = [param(np.zeros(g.shape), dtype="float32") for g in grads]
    for h, d, g in zip(host, device, grads):
        h.grad, d.grad = g.copy(), g.copy()
    total_host = clip_grad_norm(host, max_norm)
    total_device = clip_grad_norm(device, max_norm, sync=False)
    assert hasattr(total_device, "dtype") and np.ndim(total_device) == 0  # an array scalar, not read back
    assert float(total_device) == pytest.approx(total_host, rel=1e-6)
    for h, d in zip(host, device):
        assert d.grad.dtype == np.float32
        np.testing.assert_allclose(d.grad, h.grad, rtol=1e-6)


def test_clip_grad_norm_without_sync_leaves_non_finite_gradients_alone():
    p = param(np.zeros(3), dtype="float32")
    p.grad = np.array([np.inf, 1.0, 2.0], dtype=np.float32)
    clip_grad_norm([p], 1.0, sync=False)
    np.testing.assert_array_equal(p.grad, [np.inf, 1.0, 2.0])
