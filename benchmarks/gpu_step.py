"""One training step (forward, backward, AdamW) on the GPU: tinymlp (CuPy) against PyTorch eager.

For each model preset (the course work's CIFAR Mixer, gMLP and aMLP: 32 x 32 images, 4 x 4
patches, 64 tokens, float32) both frameworks train the same architecture with the same weights
on one fixed batch already on the GPU, in this one process, in alternating rounds of a few
steps. Each round is timed between two device synchronisations (``cupy.cuda.Device().synchronize()``,
``torch.cuda.synchronize()``), so that the time counts the GPU work and not only its launch;
within a round the host queues steps without waiting, as a training loop does.

tinymlp's step runs three ways, each beside PyTorch eager in the same rounds:

- ``eager``: op by op, its products through the capturable cuBLAS binding (``fast/cublas.py``);
- ``cupy mm``: op by op, its products through ``cupy.matmul`` (what the binding saves, without graphs);
- ``graph``: captured once into a CUDA graph and replayed (``fast/capture.py``, as ``fit`` runs
  it): the host copies the batch in, uploads the step's scalars and launches the graph.

Printed per model: the median ms/step over the rounds, images/s, each ratio to PyTorch, the peak
GPU memory of a step (parameters, gradients, optimizer state and batch included: tinymlp's from
CuPy's memory pool, counted by a memory hook, plus the graph's own pool for ``graph``; PyTorch's
from ``torch.cuda.max_memory_allocated``), and the time a 50,000-image epoch would take at that
speed (data loading excluded: ``examples/train_cifar_mixer.py --dataset synthetic
--synthetic-size 50000`` times the whole pipeline). Neither side uses TF32 (CuPy without
CUPY_TF32=1, the binding's CUBLAS_COMPUTE_32F; PyTorch's default ``allow_tf32 = False``).

    python benchmarks/gpu_step.py                       # batch 256, the three presets
    python benchmarks/gpu_step.py --models mixer_cifar --batch-size 512 --steps 50
    python benchmarks/gpu_step.py --batch-size 128 --ways eager,graph
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
from tinymlp.fast import cublas
from tinymlp.fast.capture import CapturedStep
from tinymlp.models import create
from tinymlp.optim import AdamW

from cpu_step import tinymlp_step, torch_step  # the same training step, timed here on the GPU

EPOCH_IMAGES = 50_000
LR, WEIGHT_DECAY = 1e-3, 0.05
WAYS = ("eager", "cupy mm", "graph")


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
class CupyProducts:
    """tinymlp's step with its products through ``cupy.matmul`` (the binding switched off)."""

    def __init__(self, step):
        self.step = step

    def __call__(self):
        cublas.set_enabled(False)
        try:
            return self.step()
        finally:
            cublas.set_enabled(True)


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

    graphed = CapturedStep(lambda a, b: tinymlp_step(model, optimizer, a, b), model.parameters(),
                           lambda: tuple(optimizer.flat_state or ()))
    steps = {"eager": run_tiny, "cupy mm": CupyProducts(run_tiny), "graph": lambda: graphed(x, y)}
    steps = {way: steps[way] for way in args.ways}
    first = {"tinymlp": float(run_tiny().item())}
    runs = {f"tinymlp {way}": (step, sync_cupy) for way, step in steps.items()}
    if torch is not None:
        t_opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        tx, ty = torch.from_numpy(images).cuda(), torch.from_numpy(labels).cuda()

        def run_torch():
            return torch_step(torch, twin, t_opt, tx, ty)

        first["PyTorch"] = float(run_torch().item())
        runs["PyTorch"] = (run_torch, torch.cuda.synchronize)

    for _ in range(max(args.warmup, CapturedStep.WARMUP + 1)):   # compile, fill the pools, capture, settle
        for step, _ in runs.values():
            step()
    sync_cupy()

    rounds = max(1, math.ceil(args.steps / args.per_round))
    times = {label: [] for label in runs}
    for _ in range(rounds):             # alternate, so that all see the same GPU conditions
        for label, (step, sync) in runs.items():
            times[label] += time_rounds(step, sync, 1, args.per_round)

    result = {"name": name, "params": model.num_parameters(), "first_loss": first,
              "ms": {label: 1e3 * statistics.median(t) for label, t in times.items()}, "peak": {}}
    for way, step in steps.items():
        extra = graphed.pool.total_bytes() if way == "graph" and graphed.pool is not None else 0
        result["peak"][f"tinymlp {way}"] = cupy_peak_bytes(cp, step) + extra
    if torch is not None:
        result["peak"]["PyTorch"] = torch_peak_bytes(torch, run_torch)
    result["graph"] = graphed.reason or f"replayed ({dict(graphed.counts)})"
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
    labels = list(results[0]["ms"])
    head = (f"{'model':12s} {'params':>7s} {'step':16s} {'ms':>8s} {'vs torch':>8s} {'img/s':>9s} {'peak':>10s} "
            f"{'epoch':>8s}")
    print(head)
    print("-" * len(head))
    steps = EPOCH_IMAGES / batch
    for r in results:
        torch_ms = r["ms"].get("PyTorch")
        for k, label in enumerate(labels):
            t = r["ms"][label]
            name, params = (r["name"], f"{r['params'] / 1e6:6.2f}M") if k == 0 else ("", "")
            ratio = f"{t / torch_ms:8.2f}" if torch_ms and label != "PyTorch" else ""
            print(f"{name:12s} {params:>7s} {label:16s} {t:8.2f} {ratio:>8s} {batch / t * 1e3:9,.0f} "
                  f"{_mib(r['peak'].get(label)):>10s} {steps * t / 1e3:7.1f}s")
    print()
    for r in results:
        losses = ", ".join(f"{k} {v:.4f}" for k, v in r["first_loss"].items())
        print(f"first-step loss of {r['name']}: {losses}  (ln 10 = {math.log(10):.4f}: zero heads); "
              f"graph: {r['graph']}")
    goal = [f"{r['name']} {r['ms']['tinymlp graph'] / r['ms']['PyTorch']:.2f}x" for r in results
            if "tinymlp graph" in r["ms"] and "PyTorch" in r["ms"]]
    if goal:
        print(f"graph / PyTorch eager at batch {batch}: {', '.join(goal)} (goal at batch 128: <= 0.85x)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per framework (default 30)")
    parser.add_argument("--per-round", type=int, default=5, help="steps between two synchronisations (default 5)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--models", default="mixer_cifar,gmlp_cifar,amlp_cifar",
                        help="comma-separated presets (default: mixer_cifar,gmlp_cifar,amlp_cifar)")
    parser.add_argument("--no-torch", action="store_true", help="time tinymlp only")
    parser.add_argument("--ways", default=",".join(WAYS),
                        help=f"tinymlp's steps to time, comma-separated (default: {','.join(WAYS)})")
    args = parser.parse_args(argv)
    args.ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = [w for w in args.ways if w not in WAYS]
    if unknown or not args.ways:
        parser.error(f"--ways: {', '.join(unknown) or 'none given'}; choose from {', '.join(WAYS)}")

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
        print(f"  {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in results[-1]["ms"].items()) + " ms/step",
              flush=True)
    print()
    print_table(results, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
