"""Where a GPU training step's time goes: the host's time per op, the kernels the GPU runs.

For each model (the step of ``gpu_step.py``: forward, backward, AdamW, float32, one fixed
batch on the GPU) this prints

- the step's wall time (between two synchronisations) and the host's time to queue it (the
  time until the last launch returns): when the two are close the step is bound by the host
  (Python and launch overhead), not by the GPU;
- the host time per op (``step_profile.StepProfile``, exclusive, median over the steps);
- with PyTorch installed, the kernels the GPU ran, recorded by PyTorch's profiler (CUPTI sees
  every launch in the process, CuPy's too): kernels and memory copies per step, the GPU's busy
  time per step, and the kernels that take the most GPU time; the same for PyTorch eager's step
  on the same model, weights and batch, for comparison.

    python benchmarks/gpu_profile.py                          # mixer_cifar, batch 128
    python benchmarks/gpu_profile.py --models mixer_cifar,amlp_cifar --batch-size 512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tinymlp
from tinymlp.backend import get_cupy
from tinymlp.models import create
from tinymlp.optim import AdamW

from cpu_step import tinymlp_step, torch_step
from step_profile import StepProfile
import tinymlp.functional as F


def host_and_wall(step, sync, steps):
    """Median (host seconds to queue a step, wall seconds of the step) over ``steps`` steps."""
    host, wall = [], []
    for _ in range(steps):
        sync()
        start = time.perf_counter()
        step()
        queued = time.perf_counter()
        sync()
        host.append(queued - start)
        wall.append(time.perf_counter() - start)
    return statistics.median(host), statistics.median(wall)


def kernel_table(torch, step, sync, steps, top):
    """Kernels per step, GPU ms per step and the ``top`` kernels by GPU time, from CUPTI."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    count, total = defaultdict(int), defaultdict(float)
    for e in prof.profiler.kineto_results.events():
        if e.device_type().name != "CUDA":
            continue
        count[e.name()] += 1
        total[e.name()] += e.duration_ns() / 1e3          # microseconds
    launches = sum(count.values()) / steps
    busy = sum(total.values()) / steps / 1e3
    lines = [f"    GPU: {launches:,.0f} kernels and copies per step, busy {busy:.2f} ms per step"]
    for name in sorted(total, key=lambda n: -total[n])[:top]:
        short = name if len(name) <= 70 else name[:67] + "..."
        lines.append(f"      {total[name] / steps / 1e3:7.3f} ms {count[name] / steps:6.1f}x  {short}")
    return lines


def profile_model(name, batch, steps, top, cp, torch):
    model = create(name)
    twin = None
    if torch is not None:
        from torch_models import copy_weights, torch_like

        twin = copy_weights(torch_like(model), model).cuda()
    model.to("cuda")
    optimizer = AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    x, y = tinymlp.tensor(images, device="cuda"), tinymlp.tensor(labels, device="cuda")
    sync = cp.cuda.Device().synchronize

    def run():
        return tinymlp_step(model, optimizer, x, y)

    for _ in range(3):
        run()
    host, wall = host_and_wall(run, sync, steps)
    print(f"{name}, batch {batch}: tinymlp step {1e3 * wall:.2f} ms, of which the host queues for "
          f"{1e3 * host:.2f} ms ({100 * host / wall:.0f}%)")

    prof = StepProfile()
    with prof.patched():
        for _ in range(steps):
            sync()

            def rest(loss):
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()

            prof.record(lambda: F.cross_entropy(model(x), y), rest)
    print("  host time per op (exclusive, ms per step; the GPU runs behind):")
    print("\n".join(prof.table(top=24)))
    if torch is None:
        return
    print("  tinymlp's kernels:")
    print("\n".join(kernel_table(torch, run, sync, steps, top)))
    t_opt = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=0.05)
    tx, ty = torch.from_numpy(images).cuda(), torch.from_numpy(labels).cuda()

    def run_torch():
        return torch_step(torch, twin, t_opt, tx, ty)

    for _ in range(3):
        run_torch()
    host, wall = host_and_wall(run_torch, torch.cuda.synchronize, steps)
    print(f"  PyTorch eager: step {1e3 * wall:.2f} ms, host queues for {1e3 * host:.2f} ms; its kernels:")
    print("\n".join(kernel_table(torch, run_torch, torch.cuda.synchronize, steps, top)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mixer_cifar")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15, help="kernels listed per framework")
    parser.add_argument("--no-torch", action="store_true")
    args = parser.parse_args(argv)
    try:
        cp = get_cupy("cuda")
    except tinymlp.CudaUnavailableError as exc:
        print(f"gpu_profile.py needs a CUDA GPU: {exc}", file=sys.stderr)
        return 1
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            print("PyTorch is not installed: host times only", file=sys.stderr)
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        profile_model(name, args.batch_size, args.steps, args.top, cp, torch)
        cp.get_default_memory_pool().free_all_blocks()
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
