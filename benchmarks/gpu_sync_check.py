"""The GPU checklist's sync and parity steps, in one process (needs CuPy and a GPU).

1. **No host synchronisation inside a training step.** For each model below, one step runs
   outside (kernel compilation, memory pool warm-up), then the next batch is drawn from the
   loader (crop, flip, normalise on the device) and a whole step (forward, loss, backward,
   clip, AdamW, schedule) runs inside ``cupyx.allow_synchronize(False)``: any read of a device
   value on the host raises there. Then ``fit()`` runs a short epoch the same way (its step
   captured into a CUDA graph), the end-of-epoch metric read alone allowed.
2. **The captured step.** For each model, the step captured into a CUDA graph
   (``tinymlp/fast/capture.py``) against the eager step from the same weights on the same 50
   augmented batches, with a schedule, clipping and (one model) dropout: every loss equal (bit
   for bit), every step after the warm-up replayed, a replay inside
   ``allow_synchronize(False)`` (and the capture itself refuses any host read or upload).
3. **CPU/GPU parity.** The same preset, weights and batch give the same loss and gradients on
   both devices (float32 tolerance), with the fast tier on and off.

    python benchmarks/gpu_sync_check.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

import tinymlp
import tinymlp.functional as F
from tinymlp import fast, train
from tinymlp.backend import get_cupy, to_device
from tinymlp.data import Compose, DataLoader, HorizontalFlip, Normalize, RandomCrop, SyntheticImages
from tinymlp.fast.capture import CapturedStep
from tinymlp.models import create
from tinymlp.optim import AdamW, WarmupCosine, clip_grad_norm, param_groups

MODELS = {
    "mixer_cifar": dict(),
    "amlp_cifar": dict(),
    "gmlp_cifar, 2-D Toeplitz": dict(name="gmlp_cifar", toeplitz="2d"),
    "mixer_cifar, dropout 0.1": dict(name="mixer_cifar", dropout=0.1),
}


def loader(device, batch_size=64, num_images=256):
    data = SyntheticImages(num_images=num_images, seed=0)
    augment = Compose([RandomCrop(4), HorizontalFlip(), Normalize(data.mean, data.std)])
    return DataLoader(data, batch_size=batch_size, shuffle=True, rng=0, transform=augment, device=device)


def build(label, kwargs, device="cuda"):
    kwargs = dict(kwargs)
    name = kwargs.pop("name", label)
    return create(name, **kwargs).to(device=device)


def step(model, optimizer, x, y):
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    clip_grad_norm(model.parameters(), 1.0, sync=False)
    optimizer.step()
    return loss


def sync_check(cp, cupyx):
    failures = []
    if not hasattr(cupyx, "allow_synchronize"):     # deprecated since CuPy 10; a later CuPy may drop it
        print("  SKIPPED: this CuPy has no cupyx.allow_synchronize; a step captured into a graph refuses "
              "every host read instead (tests/test_capture.py shows it on the stand-in)")
        return failures
    for label, kwargs in MODELS.items():
        model = build(label, kwargs)
        optimizer = AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        batches = iter(loader("cuda"))
        x, y = next(batches)
        start = time.perf_counter()
        step(model, optimizer, x, y)
        cp.cuda.Device().synchronize()
        first = time.perf_counter() - start
        try:
            with cupyx.allow_synchronize(False):
                x, y = next(batches)
                loss = step(model, optimizer, x, y)
            print(f"  {label:28s} no host sync in a step: ok   (first step {first:.2f} s, "
                  f"loss {float(loss.item()):.4f})")
        except Exception as e:  # noqa: BLE001 - report every model
            failures.append(label)
            print(f"  {label:28s} FAILED: {type(e).__name__}: {e}")
    # fit(): the end-of-epoch read of the metrics is the one allowed synchronisation
    model = build("mixer_cifar", {})
    optimizer = AdamW(model.parameters(), lr=1e-3)
    read = train._to_host

    def allowed_read(*scalars):
        with cupyx.allow_synchronize(True):
            return read(*scalars)

    train._to_host = allowed_read
    try:
        with cupyx.allow_synchronize(False):
            history = train.fit(model, optimizer, loader("cuda"), epochs=1, progress=False,
                                  limit_batches=4, sync_every=10_000)
        print(f"  fit(), 4 steps inside allow_synchronize(False): ok   (train loss "
              f"{history.train_loss[-1]:.4f}; {history.graph[-1]})")
    except Exception as e:  # noqa: BLE001
        failures.append("fit")
        print(f"  fit() FAILED: {type(e).__name__}: {e}")
    finally:
        train._to_host = read
    return failures


def graph_check(cp, cupyx, steps=50):
    """Eager and captured steps from the same weights on the same batches: the same losses."""
    failures = []
    batches, source = [], loader("cuda")
    while len(batches) < steps:
        batches += list(source)
    batches = batches[:steps]
    no_sync = getattr(cupyx, "allow_synchronize", None)
    for label, kwargs in MODELS.items():
        losses, runners = {}, {}
        for way in ("eager", "graph"):
            model = build(label, kwargs)
            optimizer = AdamW(param_groups(model, 0.05), lr=1e-3)
            schedule = WarmupCosine(optimizer, warmup_steps=5, total_steps=steps)

            def one(x, y, model=model, optimizer=optimizer):
                return step(model, optimizer, x, y)

            run = one if way == "eager" else CapturedStep(one, model.parameters(),
                                                          lambda o=optimizer: tuple(o.flat_state or ()))
            runners[way], losses[way] = run, []
            for k, (x, y) in enumerate(batches):
                if way == "graph" and k == steps - 1 and no_sync is not None and run.graph is not None:
                    with no_sync(False):
                        loss = run(x, y)
                else:
                    loss = run(x, y)
                losses[way].append(float(loss.item()))
                schedule.step()
        graphed = runners["graph"]
        diff = max(abs(a - b) for a, b in zip(losses["eager"], losses["graph"]))
        ok = losses["eager"] == losses["graph"] and graphed.counts["replayed"] == steps - graphed.warmup
        failures += [] if ok else [f"{label} graph"]
        print(f"  {label:28s} {steps} steps, eager vs graph: losses {'bit-equal' if diff == 0 else 'DIFFER'} "
              f"(max |difference| {diff:.2e}, last {losses['graph'][-1]:.4f}); {dict(graphed.counts)}"
              f"{'' if no_sync is None else '; a replay inside allow_synchronize(False)'}   "
              f"{'ok' if ok else 'FAILED: ' + str(graphed.reason)}")
    return failures


def randomise(model, seed=0):
    rng = np.random.default_rng(seed)
    model.load_state_dict({k: v + 0.05 * rng.standard_normal(v.shape).astype(v.dtype)
                           for k, v in model.state_dict().items()})
    return model


def loss_and_grads(model, x, y):
    model.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.item()), {n: to_device(p.grad, "cpu").astype(np.float64)
                                for n, p in model.named_parameters() if p.grad is not None}


def parity():
    failures = []
    x_cpu, y_cpu = next(iter(loader("cpu", batch_size=16)))
    for label, kwargs in MODELS.items():
        kwargs = {k: v for k, v in kwargs.items() if k != "dropout"}   # dropout masks differ by device
        for tier in ("fast", "reference"):
            with (fast.enabled() if tier == "fast" else fast.disabled()):
                cpu = randomise(build(label, kwargs, "cpu"))
                gpu = randomise(build(label, kwargs, "cuda"))
                loss_c, grads_c = loss_and_grads(cpu, x_cpu, y_cpu)
                loss_g, grads_g = loss_and_grads(gpu, x_cpu.to("cuda"), y_cpu.to("cuda"))
            overall = max(np.abs(g).max() for g in grads_c.values())
            worst = max(np.abs(grads_g[n] - grads_c[n]).max() / max(np.abs(grads_c[n]).max(), 1e-3 * overall)
                        for n in grads_c)
            ok = abs(loss_g - loss_c) <= 1e-4 * abs(loss_c) and worst <= 1e-3 and grads_c.keys() == grads_g.keys()
            failures += [] if ok else [f"{label} {tier}"]
            print(f"  {label:28s} {tier:9s} loss cpu {loss_c:.6f} gpu {loss_g:.6f}   worst gradient "
                  f"difference {worst:.1e} (relative)   {'ok' if ok else 'FAILED'}")
    return failures


def main():
    cp = get_cupy()
    import cupyx

    print(f"tinymlp {tinymlp.__version__}, CuPy {cp.__version__}, "
          f"{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print("no host synchronisation inside a step:")
    failures = sync_check(cp, cupyx)
    print("the step captured into a CUDA graph against the eager step (batch 64):")
    failures += graph_check(cp, cupyx)
    print("CPU/GPU parity (float32, batch 16, the same weights):")
    failures += parity()
    print("all ok" if not failures else f"FAILED: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
