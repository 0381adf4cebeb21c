"""GPU tests of the captured training step (``tinymlp/fast/capture.py``) and of the capturable
products (``tinymlp/fast/cublas.py``), what the CuPy stand-in cannot show (``tests/test_capture_step.py``
shows the rest without a GPU): on a real GPU, with CuPy's capture and cuBLAS,

- the fast tier's step with its products through the binding computes what it computes through
  ``cupy.matmul`` (float32 rounding);
- a step captured into a CUDA graph replays the eager steps bit for bit (losses, parameters,
  optimizer state) over a dozen steps of every model, dropout, clipping and a schedule included;
- ``fit`` replays its steps and gives the eager run's history.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp.fast import cublas
from tinymlp.fast.capture import CapturedStep

pytestmark = pytest.mark.cuda

SMALL = {
    "mixer_cifar": dict(depth=2, dim=32, token_mlp_dim=16, channel_mlp_dim=64, dropout=0.1),
    "gmlp_cifar": dict(depth=2, dim=32, ffn_dim=64),
    "amlp_cifar": dict(depth=2, dim=32, ffn_dim=64, attn_dim=16),
    "vit_cifar": dict(depth=2, dim=32, heads=2, mlp_dim=64),
}


def train(name, graph, steps=12, batch=16):
    model = tinymlp.models.create(name, seed=0, **SMALL[name]).to("cuda")
    opt = tinymlp.optim.AdamW(tinymlp.optim.param_groups(model, 0.05), lr=1e-3)
    sched = tinymlp.optim.WarmupCosine(opt, warmup_steps=3, total_steps=steps)
    params = list(model.parameters())

    def step(x, y):
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        tinymlp.optim.clip_grad_norm(params, 1.0, sync=False)
        opt.step()
        return loss

    runner = CapturedStep(step, params, lambda: tuple(opt.flat_state or ())) if graph else step
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        x = tinymlp.tensor(rng.random((batch, 3, 32, 32)).astype(np.float32), device="cuda")
        y = tinymlp.tensor(rng.integers(0, 10, batch), device="cuda")
        losses.append(float(runner(x, y).item()))
        sched.step()
    return losses, [p.data.get() for p in params], runner


@pytest.mark.parametrize("name", list(SMALL))
def test_the_products_through_the_binding_compute_what_cupys_compute(name):
    with_binding = train(name, graph=False, steps=3)
    cublas.set_enabled(False)
    try:
        with_cupy = train(name, graph=False, steps=3)
    finally:
        cublas.set_enabled(True)
    np.testing.assert_allclose(with_binding[0], with_cupy[0], rtol=1e-5)
    for a, b in zip(with_binding[1], with_cupy[1]):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", list(SMALL))
def test_a_captured_step_replays_the_eager_steps_bit_for_bit_on_the_gpu(name):
    eager_losses, eager_params, _ = train(name, graph=False)
    losses, params, runner = train(name, graph=True)
    assert runner.reason is None, runner.reason
    assert runner.counts == {"warm-up": 2, "replayed": 10}
    assert losses == eager_losses
    for a, b in zip(params, eager_params):
        np.testing.assert_array_equal(a, b)


def test_fit_on_the_gpu_replays_its_step_and_matches_the_eager_run():
    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.train import fit

    def run(graph):
        loader = DataLoader(SyntheticImages(200, seed=0), 32, shuffle=True, device="cuda", rng=0)
        model = tinymlp.models.create("mixer_cifar", seed=0, **SMALL["mixer_cifar"]).to("cuda")
        opt = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
        return fit(model, opt, loader, epochs=2, clip=1.0, progress=False, graph=graph)

    graphed, eager = run(True), run(False)
    assert graphed.train_loss == eager.train_loss and graphed.train_acc == eager.train_acc
    assert graphed.graph[1] == "6 of 7 steps replayed from a CUDA graph (eager: 1 a batch of another shape)"
