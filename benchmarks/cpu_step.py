"""One training step (forward, backward, AdamW) on the CPU: tinymlp (NumPy) against PyTorch eager.

For each model preset (the course work's CIFAR Mixer, gMLP and aMLP: 32 x 32 images, 4 x 4
patches, 64 tokens, float32) both frameworks train the same architecture with the same weights
on one fixed batch, in this one process, with the same number of threads (NumPy's BLAS and
PyTorch's intra-op pool), in alternating runs: a tinymlp step, a PyTorch step, a run of the
matrix products alone, again and again, so that all three see the same machine conditions.

Printed per model:

- median ms per step and images/s, and the ratio tinymlp / PyTorch;
- the matmul floor: the matrix products of the step (every forward and backward GEMM, with
  the shapes recorded from tinymlp's ops during one traced step) run alone, back to back, on
  contiguous float32 operands; its share of the step is what no elementwise work can win back;
- the peak memory of a step: the most bytes allocated at once during one step, above what was
  allocated when the step began (parameters, optimizer state and the previous gradients). For
  tinymlp it is counted with ``tracemalloc`` (NumPy reports every array buffer to it); for
  PyTorch from the allocation and free events of its CPU allocator, recorded by
  ``torch.profiler`` with ``profile_memory=True``. Both count array buffers only, neither the
  BLAS libraries' own workspaces;
- the engine's fixed cost: a tiny model of the same depth (widths 8, batch 2), where the
  arithmetic is negligible and the step time is Python, graph and call overhead.

The BLAS behind NumPy, its CPU kernel and both thread counts are printed first: on the CPU
they matter as much as the code (see the README). The machine load is printed too: other
processes on the cores make every figure noisy, so compare medians taken in one run.

    python benchmarks/cpu_step.py                                  # the three presets, batch 64
    python benchmarks/cpu_step.py --models mixer --steps 20 --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

import tinymlp
import tinymlp.functional as F
from tinymlp.models import create
from tinymlp.ops.attention import Attention
from tinymlp.ops.gating import SpatialGating
from tinymlp.ops.linear import AxisLinear, Linear
from tinymlp.ops.matmul import MatMul
from tinymlp.optim import AdamW

LR, WEIGHT_DECAY = 1e-3, 0.05
ALIASES = {"mixer": "mixer_cifar", "gmlp": "gmlp_cifar", "amlp": "amlp_cifar"}
ENV_VARS = ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


# ----------------------------------------------------------------------------- NumPy's BLAS
class OpenBLAS:
    """NumPy's OpenBLAS, reached through ctypes: its CPU kernel and its thread count.

    NumPy links OpenBLAS under a symbol suffix (``scipy_openblas_..._64_``); the library is
    found among the shared objects this process has mapped. ``None`` attributes mean "not
    found" (another BLAS, or an unusual build): the benchmark then leaves threads alone.
    """

    def __init__(self):
        self.lib = self.path = None
        self._get = self._set = self._core = None
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
        except OSError:
            paths = set()
        for path in sorted(paths):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            self._get = self._find(lib, "get_num_threads")
            self._set = self._find(lib, "set_num_threads")
            self._core = self._find(lib, "get_corename")
            if self._get is not None:
                self.lib, self.path = lib, path
                break

    @staticmethod
    def _find(lib, what):
        for name in (f"scipy_openblas_{what}64_", f"openblas_{what}64_", f"openblas_{what}",
                     f"scipy_goto_{what}64_", f"goto_{what}"):
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
        return None

    @property
    def threads(self):
        return int(self._get()) if self._get is not None else None

    @threads.setter
    def threads(self, n):
        if self._set is None:
            raise RuntimeError("cannot set NumPy's BLAS threads from here: set OPENBLAS_NUM_THREADS instead")
        self._set(int(n))

    @property
    def corename(self):
        if self._core is None:
            return None
        self._core.restype = ctypes.c_char_p
        return self._core().decode()


def blas_description():
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')} ({blas.get('openblas configuration', '').strip()})"
    except Exception:  # noqa: BLE001 - older NumPy: print the plain text instead
        return "see numpy.show_config()"


# ----------------------------------------------------------------------------- the two steps
def tinymlp_step(model, optimizer, x, y):
    """One step with no host synchronisation: returns the loss Tensor (on the model's device)."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


def torch_step(torch, model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


# ----------------------------------------------------------------------------- the matmul floor
@contextlib.contextmanager
def recording_gemms(gemms):
    """Record every matrix product of the step as (batch, M, K, N), from the inputs of the ops
    that multiply matrices: the forward product, and the backward products of the inputs that
    need a gradient (the rule of a product C = A B: dA = G B^T, dB = A^T G)."""

    def product(batch, m, k, n, need_a, need_b):
        gemms.append((batch, m, k, n))        # C = A B
        if need_a:
            gemms.append((batch, m, n, k))    # dA = G B^T
        if need_b:
            gemms.append((batch, k, m, n))    # dB = A^T G

    def linear(ctx, x, weight, bias=None, **kw):
        product(1, x.size // weight.shape[0], weight.shape[0], weight.shape[1], *ctx.needs_input_grad[:2])

    def axis_linear(ctx, x, weight, bias=None, axis=0, **kw):
        axis %= x.ndim
        s, d = weight.shape
        a, r = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
        need_x, need_w = ctx.needs_input_grad[:2]
        product(a, d, s, r, need_w, need_x)   # Y_a = W^T X_a: A = W^T (D, S), B = X_a (S, R)

    def spatial_gating(ctx, z, weight, *rest, variant="split", token_axis=1, **kw):
        b, s, width = z.shape if token_axis == 1 else (z.shape[1], z.shape[0], z.shape[2])
        e = width // 2 if variant == "split" else width
        need = ctx.needs_input_grad
        product(1, s, s, b * e, need[1], need[0] or need[3] or need[4])   # W @ LN(z2): one (S, S) @ (S, B*e)

    def attention(ctx, q, k, v, *rest, **kw):
        batch, n, d, m, dv = math.prod(q.shape[:-2]), q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        product(batch, n, d, m, need_q, need_k)                       # S = Q K^T
        product(batch, n, m, dv, need_q or need_k, need_v)            # O = P V

    def matmul(ctx, a, b):
        m, k, n = (a.shape[-2] if a.ndim > 1 else 1), a.shape[-1], (b.shape[-1] if b.ndim > 1 else 1)
        batch = math.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])) if a.ndim > 2 or b.ndim > 2 else 1
        product(batch, m, k, n, *ctx.needs_input_grad[:2])

    patched = [(Linear, linear), (AxisLinear, axis_linear), (SpatialGating, spatial_gating),
               (Attention, attention), (MatMul, matmul)]
    originals = [(fn, fn.forward) for fn, _ in patched]

    def wrap(forward, record):
        def recorded(ctx, *args, **kwargs):
            record(ctx, *args, **kwargs)
            return forward(ctx, *args, **kwargs)
        return staticmethod(recorded)

    try:
        for fn, record in patched:
            fn.forward = wrap(fn.forward, record)
        yield gemms
    finally:
        for fn, forward in originals:
            fn.forward = staticmethod(forward)


class MatmulFloor:
    """The recorded GEMMs, run alone on preallocated contiguous float32 operands."""

    def __init__(self, gemms):
        rng = np.random.default_rng(0)
        self.gemms = gemms
        self.operands = {}
        for shape in set(gemms):
            batch, m, k, n = shape
            lead = (batch,) if batch > 1 else ()
            self.operands[shape] = (rng.standard_normal(lead + (m, k), dtype=np.float32),
                                    rng.standard_normal(lead + (k, n), dtype=np.float32),
                                    np.empty(lead + (m, n), dtype=np.float32))
        self.flops = sum(2 * b * m * k * n for b, m, k, n in gemms)

    def run(self):
        for shape in self.gemms:
            a, b, out = self.operands[shape]
            np.matmul(a, b, out=out)


# ----------------------------------------------------------------------------- memory
def tinymlp_peak_bytes(step):
    """Peak bytes of NumPy buffers (and Python objects) allocated during one step, above the start."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - start


def torch_peak_bytes(torch, step):
    """Peak bytes of PyTorch's CPU allocator during one step, above the start: the running sum
    of the allocation (+) and free (-) events the profiler records, in time order."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:
        now += e.nbytes()
        peak = max(peak, now)
    return peak


# ----------------------------------------------------------------------------- one model
def build(name, batch, torch, seed=0, **overrides):
    model = create(name, **overrides)
    optimizer = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    rng = np.random.default_rng(seed)
    image_size = model.config["image_size"]
    images = rng.standard_normal((batch, 3, image_size, image_size)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    x = tinymlp.tensor(images)
    runs = {"tinymlp": lambda: tinymlp_step(model, optimizer, x, labels)}
    if torch is not None:
        from torch_models import copy_weights, torch_like

        twin = copy_weights(torch_like(model), model)
        t_opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        tx, ty = torch.from_numpy(images), torch.from_numpy(labels)
        runs["PyTorch"] = lambda: torch_step(torch, twin, t_opt, tx, ty)
    return model, runs


def alternate(runs, steps, warmup):
    """Median seconds of each run, the runs taken in turn ``steps`` times after ``warmup`` rounds."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    times = {k: [] for k in runs}
    for _ in range(steps):
        for k, run in runs.items():
            start = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_model(name, args, torch):
    model, runs = build(name, args.batch_size, torch)
    first = {k: float(run().item()) for k, run in runs.items()}
    gemms = []
    with recording_gemms(gemms):
        runs["tinymlp"]()
    floor = MatmulFloor(gemms)
    timed = dict(runs, floor=floor.run)
    medians = alternate(timed, args.steps, args.warmup)
    result = {
        "name": name, "params": model.num_parameters(), "first_loss": first,
        "gflop": floor.flops / 1e9, "n_gemms": len(gemms),
        "tinymlp_ms": 1e3 * medians["tinymlp"], "floor_ms": 1e3 * medians["floor"],
        "torch_ms": 1e3 * medians["PyTorch"] if torch is not None else None,
        "tinymlp_peak": tinymlp_peak_bytes(runs["tinymlp"]),
        "torch_peak": torch_peak_bytes(torch, runs["PyTorch"]) if torch is not None else None,
    }
    # the engine's fixed cost: same depth, every width 8, batch 2
    small = dict(image_size=8, patch_size=4, dim=8)
    small.update(dict(token_mlp_dim=8, channel_mlp_dim=8) if "mixer" in name else dict(ffn_dim=8))
    if "amlp" in name:
        small["attn_dim"] = 8
    _, tiny_runs = build(name, 2, torch, **small)
    tiny = alternate(tiny_runs, 20, 3)
    result["tiny_tinymlp_ms"] = 1e3 * tiny["tinymlp"]
    result["tiny_torch_ms"] = 1e3 * tiny["PyTorch"] if torch is not None else None
    return result


# ----------------------------------------------------------------------------- report
def _mib(n):
    return f"{n / 2**20:,.0f} MiB" if n is not None else "-"


def _f(v, fmt):
    return format(v, fmt) if v is not None else "-"


def print_header(blas, torch, args):
    print(f"NumPy    {np.__version__}, BLAS {blas_description()}")
    print(f"         OpenBLAS kernel {blas.corename or '?'}, {blas.threads or '?'} thread(s)"
          + (f"  [{blas.path}]" if blas.path else ""))
    if torch is not None:
        backend = "MKL" if torch.backends.mkl.is_available() else "no MKL"
        print(f"PyTorch  {torch.__version__}, eager, {backend}, {torch.get_num_threads()} intra-op thread(s)")
    else:
        print("PyTorch  not installed: tinymlp only")
    env = ", ".join(f"{k}={os.environ[k]}" for k in ENV_VARS if k in os.environ) or "none set"
    print(f"env      {env}")
    print(f"machine  {os.cpu_count()} logical CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    print(f"step     forward + backward + AdamW, float32, batch {args.batch_size}; median of {args.steps} "
          f"alternating runs after {args.warmup} warm-up rounds")
    print()


def print_table(results, batch):
    head = (f"{'model':12s} {'params':>7s} {'GFLOP':>6s} {'tinymlp ms':>10s} {'torch ms':>9s} {'ratio':>6s} "
            f"{'tiny img/s':>10s} {'torch img/s':>11s} {'matmul ms':>9s} {'share':>6s} "
            f"{'tiny peak':>10s} {'torch peak':>10s}")
    print(head)
    print("-" * len(head))
    for r in results:
        t, p, f = r["tinymlp_ms"], r["torch_ms"], r["floor_ms"]
        print(f"{r['name']:12s} {r['params'] / 1e6:6.2f}M {r['gflop']:6.1f} {t:10.1f} {_f(p, '9.1f')} "
              f"{_f(t / p if p else None, '6.2f')} {batch / t * 1e3:10.0f} {_f(batch / p * 1e3 if p else None, '11.0f')} "
              f"{f:9.1f} {f / t:6.2f} {_mib(r['tinymlp_peak']):>10s} {_mib(r['torch_peak']):>10s}")
    print()
    print("ratio = tinymlp ms / torch ms (below 1: tinymlp is faster); matmul ms = the step's GEMMs alone "
          "(the floor); share = matmul ms / tinymlp ms")
    print("peak = most bytes allocated at once during a step above its start (tinymlp: tracemalloc; "
          "PyTorch: profiler allocator events)")
    for r in results:
        t_tiny, p_tiny = r["tiny_tinymlp_ms"], r["tiny_torch_ms"]
        print(f"{r['name']}: {r['n_gemms']} GEMMs at {r['gflop'] / r['floor_ms'] * 1e3:.0f} GFLOP/s alone; "
              f"same depth at width 8 (fixed cost per step): tinymlp {t_tiny:.1f} ms = "
              f"{t_tiny / r['tinymlp_ms']:.1%} of its step, PyTorch {_f(p_tiny, '.1f')} ms")
        losses = ", ".join(f"{k} {v:.4f}" for k, v in r["first_loss"].items())
        print(f"  first-step loss: {losses}  (ln 10 = {math.log(10):.4f}: zero heads)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mixer,gmlp,amlp",
                        help="comma-separated presets or mixer/gmlp/amlp (default: mixer,gmlp,amlp)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per framework (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for NumPy's BLAS and PyTorch (default: NumPy's BLAS default)")
    parser.add_argument("--no-torch", action="store_true", help="time tinymlp only")
    parser.add_argument("--show-config", action="store_true", help="print numpy.show_config() in full first")
    args = parser.parse_args(argv)
    if args.show_config:
        np.show_config()
        print()

    blas = OpenBLAS()
    if args.threads is not None:
        blas.threads = args.threads
    torch = None
    if not args.no_torch:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is not None:
        threads = blas.threads or args.threads
        if threads:
            torch.set_num_threads(threads)
        sys.path.insert(0, str(Path(__file__).resolve().parent))    # for torch_models

    print_header(blas, torch, args)
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        name = ALIASES.get(name, name)
        results.append(bench_model(name, args, torch))
        r = results[-1]
        print(f"  {name}: tinymlp {r['tinymlp_ms']:.0f} ms/step, PyTorch {_f(r['torch_ms'], '.0f')} ms/step, "
              f"matmuls alone {r['floor_ms']:.0f} ms", flush=True)
    print(f"  load average {os.getloadavg()[0]:.2f} at the end")
    print()
    print_table(results, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
