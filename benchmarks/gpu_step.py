"""One training step (forward, backward, AdamW) on the GPU: tinymlp (CuPy) against PyTorch eager.

For each model preset (the course work's CIFAR Mixer, gMLP and aMLP: 32 x 32 images, 4 x 4
patches, 64 tokens, float32) both frameworks train the same architecture with the same weights
on one fixed batch already on the GPU, in this one process, in alternating rounds of a few
steps. Each round is timed between two device synchronisations (``cupy.cuda.Device().synchronize()``,
``torch.cuda.synchronize()``), so that the time counts the GPU work and not only its launch;
within a round the host queues steps without waiting, as a training loop does.

Printed per model: the median ms/step over the rounds, images/s, the ratio tinymlp / PyTorch,
the peak GPU memory of a step (parameters, gradients, optimizer state and batch included:
tinymlp's from CuPy's memory pool, counted by a memory hook; PyTorch's from
``torch.cuda.max_memory_allocated``), and the time a 50,000-image epoch would take at that
speed (data loading excluded). Neither side uses TF32 (CuPy without CUPY_TF32=1; PyTorch's
default ``allow_tf32 = False`` for matmuls).

    python benchmarks/gpu_step.py                       # batch 256, the three presets
    python benchmarks/gpu_step.py --models mixer_cifar --batch-size 512 --steps 50
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # for cpu_step and torch_models

import tinymlp
from tinymlp.backend import get_cupy
from tinymlp.models import create
from tinymlp.optim import AdamW

from cpu_step import tinymlp_step, torch_step  # the same training step, timed here on the GPU

EPOCH_IMAGES = 50_000
LR, WEIGHT_DECAY = 1e-3, 0.05


# ----------------------------------------------------------------------------- measuring
def time_rounds(step, sync, rounds, per_round):
    """Median seconds per step over ``rounds`` rounds of ``per_round`` steps (synchronised ends)."""
    times = []
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(per_round):
            step()
        sync()
        times.append((time.perf_counter() - start) / per_round)
    return times


def cupy_peak_bytes(cp, step):
    """Peak bytes in use in CuPy's memory pool during one ``step`` (what was in use before included).

    A MemoryHook sees every allocation from and release to the pool, in host order: the pool
    is stream-ordered, so that is exactly what the pool must hold at each moment.
    """
    class Peak(cp.cuda.MemoryHook):
        name = "tinymlp_benchmark_peak"

        def __init__(self):
            self.now = self.peak = 0

        def malloc_postprocess(self, **kw):
            self.now += kw["mem_size"]
            self.peak = max(self.peak, self.now)

        def free_postprocess(self, **kw):
            self.now -= kw["mem_size"]

    cp.cuda.Device().synchronize()
    base = cp.get_default_memory_pool().used_bytes()
    hook = Peak()
    with hook:
        step()
        cp.cuda.Device().synchronize()
    return base + hook.peak


def torch_peak_bytes(torch, step):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


# ----------------------------------------------------------------------------- one model
def bench_model(name, args, cp, torch):
    model = create(name)
    if torch is not None:   # same weights on both sides: the twin is built before the move to the GPU
        from torch_models import copy_weights, torch_like

        twin = copy_weights(torch_like(model), model).cuda()
    model.to("cuda")
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)

    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch_size, 3, 32, 32)).astype(np.float32)
    labels = rng.integers(0, 10, args.batch_size)
    x, y = tinymlp.tensor(images, device="cuda"), tinymlp.tensor(labels, device="cuda")
    sync_cupy = cp.cuda.Device().synchronize

    def run_tiny():
        return tinymlp_step(model, optimizer, x, y)

    first = {"tinymlp": float(run_tiny().item())}
    if torch is not None:
        t_opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        tx, ty = torch.from_numpy(images).cuda(), torch.from_numpy(labels).cuda()

        def run_torch():
            return torch_step(torch, twin, t_opt, tx, ty)

        first["PyTorch"] = float(run_torch().item())

    for _ in range(args.warmup):        # compile kernels, fill the memory pools, settle clocks
        run_tiny()
        if torch is not None:
            run_torch()
    sync_cupy()

    rounds = max(1, math.ceil(args.steps / args.per_round))
    tiny_times, torch_times = [], []
    for _ in range(rounds):             # alternate, so that both see the same GPU conditions
        tiny_times += time_rounds(run_tiny, sync_cupy, 1, args.per_round)
        if torch is not None:
            torch_times += time_rounds(run_torch, torch.cuda.synchronize, 1, args.per_round)

    result = {
        "name": name,
        "params": model.num_parameters(),
        "first_loss": first,
        "tinymlp_ms": 1e3 * statistics.median(tiny_times),
        "tinymlp_peak": cupy_peak_bytes(cp, run_tiny),
        "torch_ms": 1e3 * statistics.median(torch_times) if torch_times else None,
        "torch_peak": torch_peak_bytes(torch, run_torch) if torch is not None else None,
    }
    return result


# ----------------------------------------------------------------------------- report
def _mib(n):
    return f"{n / 2**20:,.0f} MiB" if n is not None else "-"


def print_header(cp, torch, args):
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    runtime = cp.cuda.runtime.runtimeGetVersion()
    print(f"device   {name} ({props['totalGlobalMem'] / 2**30:.0f} GiB, compute {props['major']}.{props['minor']})")
    print(f"tinymlp  {tinymlp.__version__}, CuPy {cp.__version__}, "
          f"CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}, CUPY_TF32={os.environ.get('CUPY_TF32', 'unset')}")
    if torch is not None:
        print(f"PyTorch  {torch.__version__} (CUDA {torch.version.cuda}), eager, "
              f"matmul allow_tf32={torch.backends.cuda.matmul.allow_tf32}")
    else:
        print("PyTorch  not available: tinymlp only")
    print(f"step     forward + backward + AdamW, float32, batch {args.batch_size}; median of "
          f"{math.ceil(args.steps / args.per_round)} rounds of {args.per_round} steps "
          f"after {args.warmup} warm-up steps")
    print()


def print_table(results, batch):
    head = (f"{'model':12s} {'params':>7s} {'tinymlp ms':>10s} {'torch ms':>9s} {'ratio':>6s} "
            f"{'tinymlp img/s':>13s} {'torch img/s':>11s} {'tinymlp peak':>12s} {'torch peak':>10s} "
            f"{'epoch (tinymlp)':>15s} {'epoch (torch)':>13s}")
    print(head)
    print("-" * len(head))
    steps = EPOCH_IMAGES / batch
    for r in results:
        t, p = r["tinymlp_ms"], r["torch_ms"]
        print(f"{r['name']:12s} {r['params'] / 1e6:6.2f}M {t:10.2f} {p if p is not None else float('nan'):9.2f} "
              f"{t / p if p else float('nan'):6.2f} {batch / t * 1e3:13,.0f} "
              f"{batch / p * 1e3 if p else float('nan'):11,.0f} "
              f"{_mib(r['tinymlp_peak']):>12s} {_mib(r['torch_peak']):>10s} "
              f"{steps * t / 1e3:14.1f}s {steps * p / 1e3 if p else float('nan'):12.1f}s")
    print()
    for r in results:
        losses = ", ".join(f"{k} {v:.4f}" for k, v in r["first_loss"].items())
        print(f"first-step loss of {r['name']}: {losses}  (ln 10 = {math.log(10):.4f}: zero heads)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per framework (default 30)")
    parser.add_argument("--per-round", type=int, default=5, help="steps between two synchronisations (default 5)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--models", default="mixer_cifar,gmlp_cifar,amlp_cifar",
                        help="comma-separated presets (default: mixer_cifar,gmlp_cifar,amlp_cifar)")
    parser.add_argument("--no-torch", action="store_true", help="time tinymlp only")
    args = parser.parse_args(argv)

    if not tinymlp.cuda_available():
        try:
            get_cupy("cuda")
        except tinymlp.CudaUnavailableError as exc:  # its message says what is missing and how to fix it
            print(f"gpu_step.py needs a CUDA GPU: {exc}", file=sys.stderr)
        return 1
    cp = get_cupy("cuda")
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and not torch.cuda.is_available():
            print("PyTorch is installed without CUDA support: timing tinymlp only", file=sys.stderr)
            torch = None

    print_header(cp, torch, args)
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        results.append(bench_model(name, args, cp, torch))
        cp.get_default_memory_pool().free_all_blocks()    # the model's arrays are gone: start clean
        if torch is not None:
            torch.cuda.empty_cache()
        print(f"  {name}: tinymlp {results[-1]['tinymlp_ms']:.2f} ms/step", flush=True)
    print()
    print_table(results, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
