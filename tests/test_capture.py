"""CUDA graphs on the CuPy stand-in (``tests/standin_capture.py``): capture refuses what CuPy 14
refuses, a replay reads the buffers' contents at launch, and the per-step values of a captured
step reach its kernels through device memory (``tinymlp/fast/scalars.py``), so that replays equal
the eager steps bit for bit and leave the host state of as many eager steps.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

import tinymlp
from tinymlp.fast import scalars

import cupy_standin
from cupy_standin import CUDARuntimeError


@pytest.fixture
def gpu(monkeypatch):
    cp = cupy_standin.install(monkeypatch)
    cupy_standin.emulate(monkeypatch)
    yield cp
    cupy_standin.clear_kernel_caches()


@contextlib.contextmanager
def capturing(cp, pool=True):
    """``with capturing(cp) as graphs:`` captures the block on a stream of its own (from a private
    pool unless ``pool`` is False); ``graphs[0]`` is the graph after the block."""
    stream, graphs = cp.cuda.Stream(non_blocking=True), []
    allocator = cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc) if pool else contextlib.nullcontext()
    with stream, allocator:
        stream.begin_capture()
        try:
            yield graphs
        finally:
            graphs.append(stream.end_capture())


# ============================================================================ what capture refuses
def test_capture_refuses_what_cupy_14_refuses_with_its_errors(gpu):
    cp = gpu
    a, b = cp.asarray(np.ones((3, 3), np.float32)), cp.asarray(np.ones((3, 3), np.float32))
    refused = [
        (lambda: float(a.sum()), RuntimeError, "capturing, so D2H transfers are disallowed"),
        (lambda: a.get(), RuntimeError, "capturing, so D2H transfers are disallowed"),
        (lambda: cp.asarray(np.ones(3)), RuntimeError, "capturing, so H2D transfers are disallowed"),
        (lambda: a.set(np.ones((3, 3), np.float32)), RuntimeError, "H2D transfers are disallowed"),
        (lambda: cp.concatenate([a.ravel()] * 9), RuntimeError, "H2D transfers are disallowed"),
        (lambda: cp.matmul(a, b), NotImplementedError, "calling cuBLAS API during stream capture"),
        (lambda: a @ b, NotImplementedError, "calling cuBLAS API during stream capture"),
        (lambda: cp.einsum("ij,jk->ik", a, b), NotImplementedError, "cuBLAS"),
        (lambda: cp.random.default_rng(0).random(3), NotImplementedError, "calling cuRAND API"),
        (lambda: cp.cuda.get_current_stream().synchronize(), CUDARuntimeError, "cudaErrorStreamCaptureUnsupported"),
    ]
    for run, error, message in refused:
        with pytest.raises(error, match=message), capturing(cp):
            run()
    with pytest.raises(RuntimeError, match="allocation during capture from the shared memory pool"), \
            capturing(cp, pool=False):
        a + b
    with pytest.raises(RuntimeError, match="cannot capture on the default"):
        cp.cuda.get_current_stream().begin_capture()
    with capturing(cp):                                      # a few concatenated arrays need no table
        cp.concatenate([a.ravel()] * 8)


def test_a_graph_runs_nothing_at_capture_and_replays_on_the_buffers_contents_at_launch(gpu):
    cp = gpu
    x = cp.asarray(np.arange(4, dtype=np.float32))
    out = cp.zeros(4, dtype=np.float32)
    with capturing(cp) as graphs:
        y = x * 2 + 1                                        # allocated from the pool, not computed
        cp.multiply(y, x, out=out)                           # an in-place write: not done yet
    assert np.isnan(y._a).all() and (out.get() == 0).all()
    for start in (0.0, 10.0):
        x.set(np.arange(4, dtype=np.float32) + start)
        graphs[0].launch()
        v = np.arange(4, dtype=np.float32) + start
        np.testing.assert_array_equal(out.get(), (v * 2 + 1) * v)


def test_a_graph_that_reads_memory_freed_since_its_capture_faults(gpu):
    cp = gpu
    x = cp.asarray(np.ones(3, np.float32))
    with capturing(cp) as graphs:
        x + 1
    graphs[0].launch()
    del x
    with pytest.raises(CUDARuntimeError, match="illegal memory access.*freed since its capture"):
        graphs[0].launch()


# ============================================================================ step scalars on the device
def _adamw(cp, seed, steps):
    """Parameters, static gradient buffers, AdamW with a warmup schedule, and each step's gradients."""
    rng = np.random.default_rng(seed)
    shapes = [(4, 3), (3,), (2, 2, 2), (5,)] * 3                 # 12 parameters: CuPy would concatenate
    params = [tinymlp.tensor(rng.standard_normal(s).astype(np.float32), device="cuda", requires_grad=True)
              for s in shapes]
    for p in params:
        p.grad = cp.zeros(p.shape, np.float32)
    opt = tinymlp.optim.AdamW([{"params": params[:6], "weight_decay": 0.1}, {"params": params[6:]}], lr=0.05,
                              weight_decay=0.0)
    sched = tinymlp.optim.WarmupCosine(opt, warmup_steps=2, total_steps=steps)
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(steps)]
    return params, opt, sched, grads


def _step(params, opt, grads):
    for p, g in zip(params, grads):
        p.grad.set(g)                                            # this step's gradients, in place
    tinymlp.optim.clip_grad_norm(params, 2.0, sync=False)
    opt.step()


def test_a_captured_adamw_step_replays_the_eager_steps_bit_for_bit_and_resumes_exactly(gpu):
    """Learning rate (a schedule), bias corrections and decay change every step: the replays read
    them from the buffer each one's host half filled, so they equal the eager steps bit for bit,
    and the step counts (the state a checkpoint saves) are the eager run's."""
    cp, steps = gpu, 6
    params, opt, sched, grads = _adamw(cp, 0, steps)
    for k in range(steps):                                       # eager
        _step(params, opt, grads[k])
        sched.step()

    params2, opt2, sched2, _ = _adamw(cp, 0, steps)
    _step(params2, opt2, grads[0])                               # the warm-up step, eager
    sched2.step()
    with scalars.recording() as rec, capturing(cp) as graphs:
        tinymlp.optim.clip_grad_norm(params2, 2.0, sync=False)
        opt2.step()
    graph = graphs[0]
    for k in range(1, steps):                                    # the replays
        for p, g in zip(params2, grads[k]):
            p.grad.set(g)
        rec.prepare()
        graph.launch()
        sched2.step()
    for a, b in zip(params, params2):
        np.testing.assert_array_equal(a.data.get(), b.data.get())
    saved, replayed = opt.state_dict(), opt2.state_dict()
    assert [e["step"] for e in replayed["state"].values()] == [steps] * len(params)
    for key, entry in saved["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(entry[name], replayed["state"][key][name])


def test_a_step_captured_outside_a_recording_is_refused(gpu):
    cp = gpu
    params, opt, _, grads = _adamw(cp, 1, 2)
    _step(params, opt, grads[0])
    with pytest.raises(RuntimeError, match="captured outside tinymlp.fast.scalars.recording"), capturing(cp):
        opt.step()


def test_captured_dropout_draws_the_eager_masks_from_the_same_generator(gpu):
    """The seed slots are filled before each replay in the eager step's order of draws: the same
    masks, and the generator left where the eager run leaves it (a checkpoint resumes exactly)."""
    cp = gpu
    host = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    x = tinymlp.tensor(host, device="cuda")
    eager_rng, captured_rng = np.random.default_rng(5), np.random.default_rng(5)
    eager = []
    for _ in range(4):
        y = tinymlp.functional.dropout(x, 0.5, rng=eager_rng)
        z = tinymlp.functional.dropout(y, 0.25, rng=eager_rng)
        eager.append((y.data.get(), z.data.get()))
    before = captured_rng.bit_generator.state
    with scalars.recording() as rec, capturing(cp) as graphs:
        y = tinymlp.functional.dropout(x, 0.5, rng=captured_rng)
        z = tinymlp.functional.dropout(y, 0.25, rng=captured_rng)
    assert captured_rng.bit_generator.state == before                   # nothing drawn at capture
    for want_y, want_z in eager:
        rec.prepare()
        graphs[0].launch()
        np.testing.assert_array_equal(y.data.get(), want_y)
        np.testing.assert_array_equal(z.data.get(), want_z)
    assert captured_rng.integers(2**63) == eager_rng.integers(2**63)
