"""The whole training step captured into a CUDA graph and replayed (``tinymlp/fast/capture.py``),
on the CuPy stand-in (``tests/standin_capture.py``), which refuses during capture what CuPy 14
refuses and replays the recorded operations on the memory they were recorded with:

- every model's step goes through the capturable products (no CuPy product in the fast tier on CUDA);
- a captured step replays to the eager step's numbers, bit for bit, over many steps (losses,
  parameters, optimizer state and step counts), with dropout, clipping and a schedule;
- a step that cannot be replayed runs eagerly and says why (another shape, an optimizer whose
  step cannot be captured, the fast tier off, no cuBLAS binding, a batch that carries values of
  its own); replaced arrays are captured again;
- the graph holds what it reads from caches; the in-place guard, checkpoints and resume keep
  their promises; ``fit`` replays its steps, reads the device only for its metrics, and says
  which steps ran how.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinymlp
import tinymlp.functional as F
from tinymlp import backend
from tinymlp.fast import cublas
from tinymlp.fast.capture import CapturedStep
from tinymlp.fast.kernels import optim_cuda

import cupy_standin
from cupy_standin import READS

SMALL = {
    "mixer_cifar": dict(depth=2, dim=16, token_mlp_dim=8, channel_mlp_dim=32, dropout=0.1),
    "gmlp_cifar": dict(depth=2, dim=16, ffn_dim=32),
    "amlp_cifar": dict(depth=2, dim=16, ffn_dim=32, attn_dim=8),
    "vit_cifar": dict(depth=2, dim=16, heads=2, mlp_dim=32),
}


@pytest.fixture
def gpu(monkeypatch):
    cp = cupy_standin.install(monkeypatch)
    cupy_standin.emulate(monkeypatch)
    yield cp
    cupy_standin.clear_kernel_caches()


class Run:
    """A model, AdamW on two param groups with a warmup-cosine schedule, and its step."""

    def __init__(self, name, optimizer="adamw", steps=12, seed=0, **overrides):
        self.model = tinymlp.models.create(name, seed=seed, **{**SMALL[name], **overrides}).to("cuda")
        groups = tinymlp.optim.param_groups(self.model, 0.05)
        self.opt = (tinymlp.optim.AdamW(groups, lr=1e-3) if optimizer == "adamw"
                    else tinymlp.optim.SGD(groups, lr=1e-2, momentum=0.9))
        self.sched = tinymlp.optim.WarmupCosine(self.opt, warmup_steps=3, total_steps=steps)
        self.params = list(self.model.parameters())

    def step(self, x, y):
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.opt.zero_grad()
        loss.backward()
        tinymlp.optim.clip_grad_norm(self.params, 1.0, sync=False)
        self.opt.step()
        return loss

    def captured(self, **kwargs):
        return CapturedStep(self.step, self.params, lambda: tuple(self.opt.flat_state or ()), **kwargs)

    def train(self, runner, batches):
        losses = []
        for x, y in batches:
            losses.append(float(runner(x, y).data.get()))
            self.sched.step()
        return losses

    def state(self):
        return [p.data.get() for p in self.params], self.opt.state_dict()


def batches(count, batch=4, seed=0, last=None):
    rng = np.random.default_rng(seed)
    sizes = [batch] * count + ([last] if last else [])
    return [(tinymlp.tensor(rng.random((n, 3, 32, 32)).astype(np.float32), device="cuda"),
             tinymlp.tensor(rng.integers(0, 10, n), device="cuda")) for n in sizes]


def assert_same_state(a, b):
    (params_a, opt_a), (params_b, opt_b) = a, b
    for i, (u, v) in enumerate(zip(params_a, params_b)):
        np.testing.assert_array_equal(u, v, err_msg=f"parameter {i}")
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for key, entry in opt_a["state"].items():
        assert entry["step"] == opt_b["state"][key]["step"]
        for name in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_array_equal(entry[name], opt_b["state"][key][name])


# ============================================================================ products
@pytest.mark.parametrize("name", list(SMALL))
def test_the_fast_tier_on_cuda_multiplies_through_the_capturable_binding(gpu, name):
    run = Run(name)
    (x, y), = batches(1)
    run.step(x, y)
    cupy_standin.OPS.reset()
    run.step(x, y)
    kinds = cupy_standin.OPS.kinds
    assert kinds["cublas gemm"] > 10, kinds
    cupy_products = {k: n for k, n in kinds.items() if k in ("matmul", "dot", "vdot", "einsum", "tensordot")}
    assert not cupy_products, f"products through CuPy (refused during capture): {cupy_products}"


@pytest.fixture
def cupy_products():
    cublas.set_enabled(False)
    yield
    cublas.set_enabled(True)


def test_without_the_binding_the_products_are_cupys_and_the_step_is_not_captured(gpu, cupy_products):
    run = Run("gmlp_cifar")
    runner = run.captured()
    data = batches(4)
    eager = Run("gmlp_cifar")
    assert run.train(runner, data) == eager.train(eager.step, data)
    assert runner.counts == {"no capturable matrix products (TINYMLP_CUBLAS=0, or libcublas did not load)": 4}


# ============================================================================ replays equal the eager steps
@pytest.mark.parametrize("name", [n if n == "mixer_cifar" else pytest.param(n, marks=pytest.mark.slow) for n in SMALL])
def test_a_captured_step_replays_the_eager_steps_bit_for_bit(gpu, name):
    """Forward, loss, backward, clipping and AdamW (two groups, a schedule; the Mixer with
    dropout), captured after two warm-up steps and replayed: the same losses at every step, the
    same parameters, moments and step counts at the end; nothing refused during capture."""
    data = batches(12)
    eager, graphed = Run(name), Run(name)
    runner = graphed.captured()
    assert graphed.train(runner, data) == eager.train(eager.step, data)
    assert runner.reason is None and runner.counts == {"warm-up": 2, "replayed": 10}
    assert_same_state(graphed.state(), eager.state())
    assert all(p.grad is g for p, g in zip(graphed.params, runner.grads))     # the graph's gradients


def test_a_replayed_step_reads_nothing_back_and_issues_a_few_host_operations(gpu):
    run = Run("mixer_cifar")
    runner = run.captured()
    data = batches(4)
    for x, y in data[:3]:
        runner(x, y)
    cupy_standin.OPS.reset()
    with cupy_standin.no_host_reads():
        runner(*data[3])
    kinds = cupy_standin.OPS.kinds
    # the batch copied in (2), the step's scalars (AdamW's, per group: 2; the dropout seeds: 1), the launch
    assert kinds["graph launch"] == 1 and cupy_standin.OPS.count <= 6, kinds


@pytest.mark.slow
def test_the_last_partial_batch_runs_eagerly_and_equals_the_eager_step(gpu):
    data = batches(5, last=3)
    eager, graphed = Run("amlp_cifar"), Run("amlp_cifar")
    runner = graphed.captured()
    assert graphed.train(runner, data) == eager.train(eager.step, data)
    assert runner.counts == {"warm-up": 2, "replayed": 3, "a batch of another shape": 1}
    assert runner.why == "a batch of another shape"
    assert_same_state(graphed.state(), eager.state())


def test_an_optimizer_whose_step_cannot_be_captured_runs_eagerly_and_says_why(gpu):
    """SGD takes its learning rate as a host number: captured, every replay would use the first
    one. Its step refuses capture; the step runs eagerly from then on, with the same numbers."""
    data = batches(5)
    eager, graphed = Run("gmlp_cifar", optimizer="sgd"), Run("gmlp_cifar", optimizer="sgd")
    runner = graphed.captured()
    assert graphed.train(runner, data) == eager.train(eager.step, data)
    assert "optimizer.step() cannot be captured" in runner.reason and "SGD's step" in runner.reason
    assert runner.counts["warm-up"] == 2 and "replayed" not in runner.counts
    for a, b in zip(graphed.params, eager.params):
        np.testing.assert_array_equal(a.data.get(), b.data.get())


def test_steps_that_cannot_be_captured_at_all_run_eagerly_with_their_reason(gpu):
    run = Run("gmlp_cifar")
    (x, y), = batches(1)
    with tinymlp.fast.disabled():
        runner = run.captured()
        runner(x, y)
    assert runner.reason == "the fast tier is off (TINYMLP_FAST=0)"
    on_cpu = CapturedStep(lambda a: a, [])
    on_cpu(tinymlp.tensor(np.ones(3)))
    assert on_cpu.reason == "not on CUDA"
    from tinymlp.data.text_loader import MaskedIds
    masked = CapturedStep(lambda a: a, [])
    masked(MaskedIds(x.data, x.data[:1]))
    assert masked.why == "a batch of MaskedIds (values of its own each batch)" and masked.reason is None


@pytest.mark.slow
def test_arrays_replaced_since_the_capture_are_captured_again(gpu):
    """A new optimizer state (load_state_dict) drops the graph: two warm-up steps and a new
    capture, and the run still equals the eager one."""
    data = batches(9)
    eager, graphed = Run("mixer_cifar", dropout=0.0), Run("mixer_cifar", dropout=0.0)
    runner = graphed.captured()
    losses = graphed.train(runner, data[:4])
    graphed.opt.load_state_dict(graphed.opt.state_dict())       # new flat buffers at the next step
    losses += graphed.train(runner, data[4:])
    assert losses == eager.train(eager.step, data)
    assert runner.counts == {"warm-up": 3, "replayed": 5, "arrays replaced since the capture": 1}
    assert_same_state(graphed.state(), eager.state())


@pytest.mark.slow
def test_a_text_models_step_with_label_smoothing_replays_the_eager_steps(gpu):
    """Token ids (embedding gathers and their scatter-add backward, segment ids made each step)."""
    from tinymlp.models import TextGMLP

    def run(graph):
        model = TextGMLP(40, seq_len=12, dim=16, depth=2, ffn_dim=32, num_classes=2).to("cuda")
        opt = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
        rng = np.random.default_rng(0)

        def step(x, y):
            loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

        runner = CapturedStep(step, model.parameters(), lambda: tuple(opt.flat_state or ())) if graph else step
        losses = [float(runner(tinymlp.tensor(rng.integers(0, 40, (4, 12)), device="cuda"),
                               tinymlp.tensor(rng.integers(0, 2, 4), device="cuda")).data.get()) for _ in range(6)]
        return losses, runner

    (graphed, runner), (eager, _) = run(True), run(False)
    assert graphed == eager and runner.counts == {"warm-up": 2, "replayed": 4}


# ============================================================================ what the graph holds
@pytest.mark.slow
def test_the_graph_holds_the_pointer_tables_and_constants_that_caches_let_go(gpu):
    """The optimizer's pointer tables and the Linear's ones vectors live in caches that drop
    old entries; a graph reads them by address, so it holds them: emptied caches (other tables
    and constants made since) leave the replays right."""
    data = batches(6)
    eager, graphed = Run("gmlp_cifar"), Run("gmlp_cifar")
    runner = graphed.captured()
    losses = graphed.train(runner, data[:3])
    optim_cuda._tables.clear()                                   # (the stand-in's install restores them)
    backend._device_constants.clear()
    losses += graphed.train(runner, data[3:])
    assert losses == eager.train(eager.step, data)


@pytest.mark.slow
def test_pointer_tables_first_seen_during_capture_are_uploaded_before_the_first_launch(gpu):
    """The gradients the capture allocates have addresses no table had: their tables (for the
    clipping and the gather) are filled once, before the first replay, not during capture."""
    data = batches(4)
    eager, graphed = Run("vit_cifar"), Run("vit_cifar")
    runner = graphed.captured(warmup=1)
    assert graphed.train(runner, data) == eager.train(eager.step, data)
    assert runner.recording.first and runner.recording.launched and runner.counts["replayed"] == 3


# ============================================================================ the promises kept
def test_the_in_place_guard_refuses_a_graph_whose_parameters_a_replay_changed(gpu):
    run = Run("gmlp_cifar")
    runner = run.captured()
    data = batches(4)
    for x, y in data[:3]:
        runner(x, y)
    stale = F.cross_entropy(run.model(data[0][0]), data[0][1])   # saves the parameters ...
    runner(*data[3])                                             # ... which a replay updates in place
    with pytest.raises(RuntimeError, match="modified in place|changed"):
        stale.backward()


@pytest.mark.slow
def test_a_checkpoint_taken_between_replays_resumes_exactly(gpu, tmp_path):
    """Saved after replayed steps (their step counts advanced by the host halves), loaded into a
    fresh model and optimizer, continued with a new capture: the uninterrupted eager run."""
    from tinymlp import checkpoint
    data = batches(10)
    eager = Run("mixer_cifar", dropout=0.0)
    want = eager.train(eager.step, data)
    first = Run("mixer_cifar", dropout=0.0)
    losses = first.train(first.captured(), data[:6])
    checkpoint.save(tmp_path / "run.npz", first.model, first.opt, first.sched, epoch=1)
    second = Run("mixer_cifar", dropout=0.0, seed=1)
    checkpoint.load(tmp_path / "run.npz", second.model, second.opt, second.sched)
    losses += second.train(second.captured(), data[6:])
    assert losses == want
    assert_same_state(second.state(), eager.state())


# ============================================================================ fit
def _fit(graph, epochs=2):
    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.train import fit
    loader = DataLoader(SyntheticImages(44, seed=0), 8, shuffle=True, device="cuda", rng=0)   # 5 of 8, one of 4
    model = tinymlp.models.create("mixer_cifar", seed=0, **SMALL["mixer_cifar"]).to("cuda")
    optimizer = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
    schedule = tinymlp.optim.WarmupCosine(optimizer, warmup_steps=2, total_steps=12)
    before = READS.count
    history = fit(model, optimizer, loader, epochs=epochs, scheduler=schedule, clip=1.0, progress=False,
                  sync_every=100, graph=graph)
    return history, READS.count - before


@pytest.mark.slow
def test_fit_replays_its_step_and_says_which_steps_ran_how(gpu):
    graphed, reads = _fit(graph=True)
    eager, _ = _fit(graph=False)
    assert graphed.train_loss == eager.train_loss and graphed.train_acc == eager.train_acc
    assert graphed.graph == ["3 of 6 steps replayed from a CUDA graph (eager: 2 warm-up, 1 a batch of another shape)",
                             "5 of 6 steps replayed from a CUDA graph (eager: 1 a batch of another shape)"]
    assert eager.graph == ["every step eager (graph=False)"] * 2
    assert reads == 2                                            # the metrics, once an epoch
    from tinymlp.train import format_epoch
    assert "5 of 6 steps replayed from a CUDA graph" in format_epoch(graphed)


@pytest.mark.slow
def test_fit_resumed_from_a_checkpoint_continues_the_graphed_run_exactly(gpu, tmp_path):
    """A run stopped after an epoch of replayed steps (dropout on), saved, loaded into new objects
    and continued (a new capture) gives the uninterrupted run's losses."""
    from tinymlp import checkpoint
    from tinymlp.data import DataLoader, SyntheticImages
    from tinymlp.train import fit

    def setup(seed):
        loader = DataLoader(SyntheticImages(44, seed=0), 8, shuffle=True, device="cuda", rng=0)
        model = tinymlp.models.create("mixer_cifar", seed=seed, **SMALL["mixer_cifar"]).to("cuda")
        opt = tinymlp.optim.AdamW(model.parameters(), lr=1e-3)
        return loader, model, opt, tinymlp.optim.WarmupCosine(opt, warmup_steps=2, total_steps=12)

    def train(loader, model, opt, sched, **kwargs):
        return fit(model, opt, loader, scheduler=sched, clip=1.0, progress=False, **kwargs)

    whole = train(*setup(0), epochs=2)
    loader, model, opt, sched = setup(0)
    first = train(loader, model, opt, sched, epochs=1)
    checkpoint.save(tmp_path / "run.npz", model, opt, sched, epoch=1, rng=loader.rng)
    loader, model, opt, sched = setup(1)
    meta = checkpoint.load(tmp_path / "run.npz", model, opt, sched)
    loader.rng = meta["rng"]
    resumed = train(loader, model, opt, sched, epochs=2, start_epoch=1, history=first)
    assert resumed.train_loss == whole.train_loss and resumed.graph[1].startswith("3 of 6 steps replayed")
