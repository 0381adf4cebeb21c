"""One training step (forward, backward, AdamW) on the CPU: tinymlp's fast tier, its reference
tier and PyTorch eager, on the same models with the same weights and the same batch.

Rows: the course work's CIFAR presets (``mixer_cifar``, ``gmlp_cifar``, ``amlp_cifar``: 32 x 32
RGB, 4 x 4 patches, 64 tokens) and small MNIST-sized models (28 x 28 grey, 4 x 4 patches, 49
tokens, dim 64, depth 4: ``mixer_mnist``, ``gmlp_mnist``, ``amlp_mnist``), float32, batch 64.

Columns ("runs"): ``fast`` (tinymlp, fast tier: the default), ``reference`` (tinymlp with
``tinymlp.fast.disabled()``: the ops as the lessons read them), ``torch`` (PyTorch eager, the
twins of benchmarks/torch_models.py), ``matmul`` (the step's matrix products alone through NumPy's
BLAS: the floor no elementwise work can win back) and ``torch-matmul`` (the same products through
PyTorch's BLAS). With all four, the table is followed by where the gap to PyTorch comes from: the
matrix products (matmul - torch-matmul: one BLAS against the other) and everything else
((fast - matmul) - (torch - torch-matmul): the two frameworks' own work).

How it times, and why (measured: see benchmarks/RESULTS.md):

- an idle gap (``--gap``, 0.25 s) before EVERY timed step: OpenBLAS's worker thread spins for
  about 0.1 s after a matrix product and PyTorch's OpenMP threads after its ops, which slows
  whatever runs next on a 2-core machine;
- medians over ``--steps`` timed steps (default 10 for the CIFAR models, 30 for the small ones),
  the runs taken in turn, after warm-up rounds;
- ``--solo``: each run in its own process (the default times them in one process, alternating):
  in one process PyTorch keeps glibc's heap warm for NumPy and the other way round.

More runs: ``fast-nonumba`` (the NumPy fast path even where numba is installed: TINYMLP_NUMBA=0
in solo mode, ``tinymlp.fast.compiled`` switched off around the step otherwise) and, in solo
mode only, ``fast-heap`` / ``fast-nonumba-heap`` (TINYMLP_KEEP_MEMORY=0: freed memory goes back
to the OS as glibc decides by default).

Printed first: the CPU model, NumPy's BLAS and its kernel, the thread counts of both
frameworks, the numba state of tinymlp's compiled kernels, the malloc setting, and the load
average (other processes on the cores make every figure noisy: compare medians of one run).

    python benchmarks/cpu_step.py                       # all six models, one process, alternating
    python benchmarks/cpu_step.py --solo                # each run in its own process
    python benchmarks/cpu_step.py --solo --runs fast,fast-nonumba,fast-heap,reference,torch
    python benchmarks/cpu_step.py --runs fast,torch,matmul,torch-matmul   # the gap, split in two
    python benchmarks/cpu_step.py --models mixer_cifar --steps 20 --threads 1
    python benchmarks/cpu_step.py --quick               # tiny sizes, seconds: a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))       # torch_models

import tinymlp
import tinymlp.functional as F
from tinymlp import fast
from tinymlp.models import create
from tinymlp.ops.attention import Attention, SelfAttention
from tinymlp.ops.gating import SpatialGating
from tinymlp.ops.linear import Linear
from tinymlp.ops.matmul import MatMul
from tinymlp.optim import AdamW

from step_profile import StepProfile

LR, WEIGHT_DECAY = 1e-3, 0.05
_MNIST = dict(image_size=28, patch_size=4, in_channels=1, num_classes=10, dim=64, depth=4)
MODELS = {   # name -> (preset, overrides, default timed steps)
    "mixer_cifar": ("mixer_cifar", {}, 10),
    "gmlp_cifar": ("gmlp_cifar", {}, 10),
    "amlp_cifar": ("amlp_cifar", {}, 10),
    "mixer_mnist": ("mixer_cifar", dict(_MNIST, token_mlp_dim=32, channel_mlp_dim=256), 30),
    "gmlp_mnist": ("gmlp_cifar", dict(_MNIST, ffn_dim=384), 30),
    "amlp_mnist": ("amlp_cifar", dict(_MNIST, ffn_dim=384, attn_dim=32), 30),
}
ALIASES = {"mixer": "mixer_cifar", "gmlp": "gmlp_cifar", "amlp": "amlp_cifar"}
QUICK = dict(image_size=8, patch_size=4, dim=8, depth=2)      # --quick: every model this small
QUICK_WIDTHS = {"mixer": dict(token_mlp_dim=8, channel_mlp_dim=8), "gmlp": dict(ffn_dim=8),
                "amlp": dict(ffn_dim=8, attn_dim=8)}
FLOORS = ("matmul", "torch-matmul")   # runs that time the recorded matrix products alone
RUN_ENV = {   # solo-mode variants of the fast tier: environment of their process
    "fast": {}, "reference": {}, "torch": {}, "torch-matmul": {},
    "fast-nonumba": {"TINYMLP_NUMBA": "0"},
    "fast-heap": {"TINYMLP_KEEP_MEMORY": "0"},
    "fast-nonumba-heap": {"TINYMLP_NUMBA": "0", "TINYMLP_KEEP_MEMORY": "0"},
}
ENV_VARS = ("OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "TINYMLP_FAST", "TINYMLP_NUMBA",
            "TINYMLP_KEEP_MEMORY", "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_TOP_PAD_")


# ----------------------------------------------------------------------------- the machine
class OpenBLAS:
    """NumPy's OpenBLAS, reached through ctypes: its CPU kernel and its thread count (used when
    threadpoolctl is not installed; ``None`` attributes mean "not found")."""

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


def cpu_model():
    """The CPU's name, family/model numbers and widest vector unit (from /proc/cpuinfo)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    flags = info.get("flags", "").split()
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return (f"{info.get('model name', platform.machine())} (family {info.get('cpu family', '?')}, "
            f"model {info.get('model', '?')}, {vector})")


def blas_description(blas):
    """NumPy's BLAS: threadpoolctl's view when installed (library, version, kernel, threads)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        threadpool_info = None
    if threadpool_info is not None:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            p = pools[0]
            return (f"{p.get('internal_api')} {p.get('version')}, kernel {p.get('architecture')}, "
                    f"{p.get('num_threads')} thread(s) ({p.get('threading_layer')})  [threadpoolctl]")
    try:
        blas_cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas_cfg.get('name')} {blas_cfg.get('version')}"
    except Exception:  # noqa: BLE001 - older NumPy
        name = "BLAS (see numpy.show_config())"
    return f"{name}, kernel {blas.corename or '?'}, {blas.threads or '?'} thread(s)"


def numba_state():
    """What tinymlp's compiled kernels do in this process, in one line."""
    compiled = getattr(fast, "compiled", None)
    if compiled is not None and hasattr(compiled, "describe"):
        return compiled.describe()
    try:
        import numba
        return f"numba {numba.__version__} installed, but this tinymlp has no compiled kernels"
    except ImportError:
        return "numba not installed: NumPy fast path"


def memory_state():
    memory = getattr(fast, "memory", None)
    if memory is not None and hasattr(memory, "describe"):
        return memory.describe()
    return "glibc defaults (this tinymlp does not set malloc options)"


# ----------------------------------------------------------------------------- the steps
def tinymlp_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


@contextlib.contextmanager
def numba_off():
    """The NumPy fast path even where numba is installed (tinymlp.fast.compiled switched off)."""
    compiled = getattr(fast, "compiled", None)
    before = compiled.is_enabled() if compiled is not None else False
    if compiled is not None:
        compiled.set_enabled(False)
    try:
        yield
    finally:
        if compiled is not None:
            compiled.set_enabled(before)


def nonumba_step(model, optimizer, x, y):
    with numba_off():
        return tinymlp_step(model, optimizer, x, y)


def reference_step(model, optimizer, x, y):
    with fast.disabled():
        return tinymlp_step(model, optimizer, x, y)


def torch_step(torch, model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss


# ----------------------------------------------------------------------------- the matmul floor
@contextlib.contextmanager
def recording_gemms(gemms, labels=None):
    """Record every matrix product of a reference-tier step as (batch, M, K, N): the forward
    product, and the backward products of the inputs that need a gradient (C = A B: dA = G B^T,
    dB = A^T G). The fast tier runs the same products (fewer, larger ones for token mixing).
    ``labels``, if given, receives the op and pass of each product ("Linear fwd", "Linear bwd")."""
    ops = []     # the ops being recorded, outermost first: a nested op's forward product is its own, its
                 # backward products the outer op's (SelfAttention runs Attention's forward, not its backward)

    def record(label, shape):
        gemms.append(shape)
        if labels is not None:
            labels.append(f"{ops[-1] if label == 'fwd' else ops[0]} {label}")

    def product(batch, m, k, n, need_a, need_b):
        record("fwd", (batch, m, k, n))
        if need_a:
            record("bwd", (batch, m, n, k))
        if need_b:
            record("bwd", (batch, k, m, n))

    def linear(ctx, x, weight, bias=None, **kw):
        product(1, x.size // weight.shape[0], weight.shape[0], weight.shape[1], *ctx.needs_input_grad[:2])

    def spatial_gating(ctx, z, weight, *rest, variant="split", **kw):
        b, s, width = z.shape
        e = width // 2 if variant == "split" else width
        need = ctx.needs_input_grad
        product(1, s, s, b * e, need[1], need[0] or need[3] or need[4])   # W @ LN(z2) as (S, S) @ (S, B*e)

    def attention(ctx, q, k, v, *rest, **kw):
        batch, n, d, m, dv = math.prod(q.shape[:-2]), q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
        need = ctx.needs_input_grad     # (qkv,) when SelfAttention runs Attention's forward on its thirds
        need_q, need_k, need_v = need[:3] if len(need) >= 3 else need[:1] * 3
        product(batch, n, d, m, need_q, need_k)
        product(batch, n, m, dv, need_q or need_k, need_v)

    def matmul(ctx, a, b):
        m, k, n = (a.shape[-2] if a.ndim > 1 else 1), a.shape[-1], (b.shape[-1] if b.ndim > 1 else 1)
        batch = math.prod(np.broadcast_shapes(a.shape[:-2], b.shape[:-2])) if a.ndim > 2 or b.ndim > 2 else 1
        product(batch, m, k, n, *ctx.needs_input_grad[:2])

    patched = [(Linear, linear), (SpatialGating, spatial_gating), (Attention, attention), (MatMul, matmul),
               (SelfAttention, lambda *a, **kw: None)]
    originals = [(fn, fn.__dict__["forward"]) for fn, _ in patched]

    def wrap(fn, forward, shapes):
        def recorded(ctx, *args, **kwargs):
            ops.append(fn.__name__)
            try:
                shapes(ctx, *args, **kwargs)
                return forward(ctx, *args, **kwargs)
            finally:
                ops.pop()
        return staticmethod(recorded)

    try:
        for fn, shapes in patched:
            fn.forward = wrap(fn, fn.forward, shapes)
        with fast.disabled():
            yield gemms
    finally:
        for fn, forward in originals:
            fn.forward = forward


class MatmulFloor:
    """The recorded GEMMs, run alone on preallocated contiguous float32 operands; ``labels``
    (one per GEMM: the op and pass that ran it) lets ``by_label`` time them op by op."""

    def __init__(self, gemms, labels=None):
        rng = np.random.default_rng(0)
        self.gemms = gemms
        self.labels = labels
        self.operands = {}
        for shape in set(gemms):
            batch, m, k, n = shape
            lead = (batch,) if batch > 1 else ()
            self.operands[shape] = (rng.standard_normal(lead + (m, k), dtype=np.float32),
                                    rng.standard_normal(lead + (k, n), dtype=np.float32),
                                    np.empty(lead + (m, n), dtype=np.float32))
        self.flops = sum(2 * b * m * k * n for b, m, k, n in gemms)

    def run(self, only=None):
        for i, shape in enumerate(self.gemms):
            if only is None or self.labels[i] == only:
                a, b, out = self.operands[shape]
                np.matmul(a, b, out=out)

    def by_label(self, steps, gap):
        """``{label: median ms}`` of each op's products (in the order the step runs them), each
        timed alone ``steps`` times after an idle gap: the floor of that op."""
        out = {}
        for label in dict.fromkeys(self.labels or ()):
            self.run(label)
            times = []
            for _ in range(steps):
                if gap:
                    time.sleep(gap)
                start = time.perf_counter()
                self.run(label)
                times.append(time.perf_counter() - start)
            out[label] = 1e3 * statistics.median(times)
        return out

    def torch_run(self, torch):
        """The same products on the same operands (shared memory), through PyTorch's BLAS."""
        operands = {shape: tuple(torch.from_numpy(a) for a in ops) for shape, ops in self.operands.items()}

        def run():
            for shape in self.gemms:
                a, b, out = operands[shape]
                torch.matmul(a, b, out=out)
        return run


# ----------------------------------------------------------------------------- memory
def tinymlp_peak_bytes(step):
    """Peak bytes of NumPy buffers allocated during one step, above the start (tracemalloc)."""
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
    """Peak bytes of PyTorch's CPU allocator during one step (profiler allocation events)."""
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


def page_faults():
    """Minor page faults of this process so far (the OS mapping fresh memory in)."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return None


# ----------------------------------------------------------------------------- one model
def model_config(name, quick):
    preset, overrides, steps = MODELS[name]
    overrides = dict(overrides)
    if quick:
        overrides.update(QUICK)
        overrides.update(QUICK_WIDTHS[name.split("_")[0]])
    return preset, overrides, steps


def build(name, runs, batch, quick, torch, seed=0, profile=False):
    """The model, its optimizer and one fixed batch per wanted run: ``{run: step()}``; the matmul
    floor (``_floor``) where a floor run is wanted or ``profile`` (its products per op)."""
    preset, overrides, _ = model_config(name, quick)
    model = create(preset, **overrides)
    rng = np.random.default_rng(seed)
    image_size, channels = model.config["image_size"], model.config["in_channels"]
    images = rng.standard_normal((batch, channels, image_size, image_size)).astype(np.float32)
    labels = rng.integers(0, 10, batch)
    steps = {"model": model}
    if "fast" in runs or "reference" in runs or "fast-nonumba" in runs:
        x = tinymlp.tensor(images)
        if "fast-nonumba" in runs:
            nn_model = create(preset, **overrides)
            nn_opt = AdamW(nn_model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            steps["fast-nonumba"] = lambda: nonumba_step(nn_model, nn_opt, x, labels)
        if "fast" in runs:
            opt = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            steps["fast"] = lambda: tinymlp_step(model, opt, x, labels)
            steps["_profile"] = (model, opt, x, labels)
        if "reference" in runs:   # its own copy of the model, so the two never share a step
            ref_model = create(preset, **overrides)
            ref_opt = AdamW(ref_model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
            steps["reference"] = lambda: reference_step(ref_model, ref_opt, x, labels)
    if "torch" in runs and torch is not None:
        from torch_models import copy_weights, torch_like

        twin = copy_weights(torch_like(model), model)
        t_opt = torch.optim.AdamW(twin.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        tx, ty = torch.from_numpy(images), torch.from_numpy(labels)
        steps["torch"] = lambda: torch_step(torch, twin, t_opt, tx, ty)
    if any(r in runs for r in FLOORS) or profile:
        gemms, ops = [], []
        with recording_gemms(gemms, ops):
            rec_model = create(preset, **overrides)
            tinymlp_step(rec_model, AdamW(rec_model.parameters(), lr=LR), tinymlp.tensor(images), labels)
        floor = MatmulFloor(gemms, ops)
        if "matmul" in runs:
            steps["matmul"] = floor.run
        if "torch-matmul" in runs and torch is not None:
            steps["torch-matmul"] = floor.torch_run(torch)
        steps["_floor"] = floor
    return steps


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
"""``--clock``: wall time, or the process's CPU time (steadier where other work shares the cores:
with ``--threads 1`` it counts this step's own work)."""


def alternate(runs, steps, warmup, gap, clock=time.perf_counter):
    """Per run: the step times (s), the runs taken in turn, an idle gap of ``gap`` s before each."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    times = {k: [] for k in runs}
    faults = {k: 0 for k in runs}
    for _ in range(steps):
        for k, run in runs.items():
            if gap:
                time.sleep(gap)
            f0 = page_faults()
            start = clock()
            run()
            times[k].append(clock() - start)
            f1 = page_faults()
            if f0 is not None:
                faults[k] += f1 - f0
    return times, {k: v / steps for k, v in faults.items()}


def bench_model(name, runs, args, torch):
    """One model's figures for ``runs`` timed in this process (in turn)."""
    steps = build(name, runs, args.batch_size, args.quick, torch, profile=args.profile)
    model, floor, profiled = steps.pop("model"), steps.pop("_floor", None), steps.pop("_profile", None)
    timed = {k: steps[k] for k in runs if k in steps}
    first = {k: float(timed[k]().item()) for k in timed if k not in FLOORS}
    n = args.steps or model_config(name, args.quick)[2]
    times, faults = alternate(timed, n, args.warmup, args.gap, CLOCKS[args.clock])
    result = {"name": name, "params": model.num_parameters(), "steps": n, "first_loss": first,
              "ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
              "spread": {k: (1e3 * min(v), 1e3 * max(v)) for k, v in times.items()},
              "faults_mib": {k: v * 4096 / 2**20 for k, v in faults.items()},
              "peak": {}}
    if floor is not None:
        result["gflop"] = floor.flops / 1e9
    if args.profile and profiled is not None:
        floors = floor.by_label(n, args.gap) if floor is not None else None
        floor_ms = result["ms"].get("matmul", sum(floors.values()) if floors else None)  # (--solo: not timed whole)
        result["profile"] = profile(*profiled, n, args.gap).table(floor_ms, floors, top=24)
    if args.memory:
        for k in timed:
            if k in ("fast", "reference", "fast-nonumba"):
                result["peak"][k] = tinymlp_peak_bytes(timed[k])
            elif k == "torch":
                result["peak"][k] = torch_peak_bytes(torch, timed[k])
    return result


def profile(model, optimizer, x, y, steps, gap):
    """The fast step's time per op (``step_profile.StepProfile``), over ``steps`` steps."""
    prof = StepProfile()

    def rest(loss):
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    with prof.patched():
        for _ in range(steps):
            if gap:
                time.sleep(gap)
            prof.record(lambda: F.cross_entropy(model(x), y), rest)
    return prof


def merge(results):
    """Several processes' results for one model -> one."""
    out = dict(results[0])
    for key in ("ms", "spread", "faults_mib", "peak", "first_loss"):
        out[key] = {}
        for r in results:
            out[key].update(r.get(key, {}))
    for r in results:
        for key in ("gflop", "profile"):
            if key in r:
                out[key] = r[key]
    return out


# ----------------------------------------------------------------------------- report
def _f(v, fmt):
    return format(v, fmt) if v is not None else "-"


def print_header(blas, torch, args, runs):
    print(f"CPU      {cpu_model()}, {os.cpu_count()} logical CPU(s); {platform.platform()}")
    print(f"NumPy    {np.__version__}, {blas_description(blas)}")
    if torch is not None:
        mkl = "MKL" if torch.backends.mkl.is_available() else "no MKL"
        print(f"PyTorch  {torch.__version__}, eager, {mkl}, {torch.get_num_threads()} intra-op thread(s), "
              f"{torch.get_num_interop_threads()} inter-op")
    elif "torch" in runs:
        print("PyTorch  not installed: tinymlp only (pip install torch)")
    else:
        print("PyTorch  not timed (no torch run)")
    print(f"tinymlp  fast tier {'on' if fast.is_enabled() else 'OFF'}; compiled kernels: {numba_state()}")
    print(f"memory   {memory_state()}")
    env = ", ".join(f"{k}={os.environ[k]}" for k in ENV_VARS if k in os.environ) or "none set"
    print(f"env      {env}")
    print(f"load     {', '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min) at the start")
    mode = "each run in its own process" if args.solo else "one process, the runs in turn"
    steps = f"{args.steps}" if args.steps else "10 (CIFAR) / 30 (MNIST-sized)"
    print(f"timing   forward + backward + AdamW, float32, batch {args.batch_size}; {mode}; "
          f"median of {steps} timed steps after {args.warmup} warm-up round(s), "
          f"an idle gap of {args.gap} s before every timed step; {args.clock} time")
    print(f"runs     {', '.join(runs)}")
    print()


def print_table(results, runs, batch):
    tiers = [r for r in runs if r not in FLOORS]
    head = f"{'model':12s} {'params':>7s} " + " ".join(f"{r + ' ms':>12s}" for r in runs)
    if "torch" in runs:
        head += " " + " ".join(f"{r + '/torch':>14s}" for r in tiers if r != "torch")
    if "matmul" in runs and "fast" in runs:
        head += f" {'matmul share':>12s}"
    own = all(r in runs for r in ("fast", "torch", *FLOORS))
    if own:
        head += f" {'own/torch':>10s}"
    print(head)
    print("-" * len(head))
    for res in results:
        ms = res["ms"]
        line = f"{res['name']:12s} {res['params'] / 1e6:6.2f}M " + " ".join(f"{_f(ms.get(r), '12.1f')}" for r in runs)
        if "torch" in runs:
            t = ms.get("torch")
            line += " " + " ".join(f"{_f(ms[r] / t if t and r in ms else None, '14.2f')}"
                                   for r in tiers if r != "torch")
        if "matmul" in runs and "fast" in runs:
            line += f" {_f(ms['matmul'] / ms['fast'] if 'matmul' in ms else None, '12.2f')}"
        if own:
            line += f" {_f(own_work_ratio(ms), '10.2f')}"
        print(line)
    print()
    print("ms = median milliseconds per training step; X/torch = X ms / torch ms (below 1: faster than "
          "PyTorch eager); matmul = the step's matrix products alone, matmul share = matmul ms / fast ms")
    if own:
        print("own/torch = tinymlp's own work / PyTorch's: (fast - matmul) / (torch - torch-matmul), the step "
              "less its matrix products in each framework (a difference of differences: compare medians of rounds)")
    print(f"fast = tinymlp's fast tier (the default); reference = tinymlp.fast.disabled(); batch {batch}")
    print()
    if all(r in runs for r in ("fast", "torch", *FLOORS)):
        print_gap(results)
    print("spread (min-max ms), page faults per timed step (MiB of memory mapped in), peak bytes of a step:")
    for res in results:
        parts = []
        for r in runs:
            if r in res["spread"]:
                lo, hi = res["spread"][r]
                fm = res["faults_mib"].get(r)
                peak = res["peak"].get(r)
                parts.append(f"{r} {lo:.1f}-{hi:.1f}, faults {_f(fm, '.0f')} MiB"
                             + (f", peak {peak / 2**20:.0f} MiB" if peak is not None else ""))
        gflop = f", {res['gflop']:.1f} GFLOP" if "gflop" in res else ""
        print(f"  {res['name']} ({res['steps']} steps{gflop}): " + "; ".join(parts))
        losses = ", ".join(f"{k} {v:.4f}" for k, v in res["first_loss"].items())
        print(f"    first-step loss: {losses}  (ln 10 = {math.log(10):.4f}: zero heads)")
    for res in results:
        if "profile" in res:
            print()
            print(f"  {res['name']}: where the fast step's time goes (median ms per step, exclusive)")
            print("\n".join(res["profile"]))


def gap_split(ms):
    """fast - torch as (matrix products, everything else), in ms, or None where a run is missing:
    (matmul - torch-matmul) + ((fast - matmul) - (torch - torch-matmul))."""
    if not all(k in ms for k in ("fast", "torch", *FLOORS)):
        return None
    products = ms["matmul"] - ms["torch-matmul"]
    rest = (ms["fast"] - ms["matmul"]) - (ms["torch"] - ms["torch-matmul"])
    return products, rest


def own_work_ratio(ms):
    """(fast - matmul) / (torch - torch-matmul): tinymlp's non-matmul time over PyTorch's, or None."""
    if not all(k in ms for k in ("fast", "torch", *FLOORS)) or ms["torch"] <= ms["torch-matmul"]:
        return None
    return (ms["fast"] - ms["matmul"]) / (ms["torch"] - ms["torch-matmul"])


def print_gap(results):
    print("where fast - torch comes from: the matrix products (NumPy's BLAS - PyTorch's, same products) "
          "and everything else (tinymlp's non-matmul time - PyTorch's):")
    for res in results:
        split = gap_split(res["ms"])
        if split is None:
            continue
        ms = res["ms"]
        products, rest = split
        print(f"  {res['name']:12s} {ms['fast'] - ms['torch']:+7.1f} ms = products {products:+7.1f} "
              f"(NumPy {ms['matmul']:.1f}, PyTorch {ms['torch-matmul']:.1f}: x{ms['matmul'] / ms['torch-matmul']:.2f}) "
              f"+ the rest {rest:+7.1f} (tinymlp {ms['fast'] - ms['matmul']:.1f}, "
              f"PyTorch {ms['torch'] - ms['torch-matmul']:.1f}); "
              f"NumPy's products alone = {ms['matmul'] / ms['torch']:.2f} of PyTorch's step")
    print()


# ----------------------------------------------------------------------------- main
def child_command(args, name, run):
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--models", name, "--runs", run,
           "--batch-size", str(args.batch_size), "--warmup", str(args.warmup), "--gap", str(args.gap),
           "--clock", args.clock]
    if args.steps:
        cmd += ["--steps", str(args.steps)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.quick:
        cmd.append("--quick")
    if args.memory:
        cmd.append("--memory")
    if args.profile:
        cmd.append("--profile")
    return cmd


def run_solo(args, models, runs):
    """Each (model, run) in a fresh process; the variants' environments applied there."""
    results = []
    for name in models:
        parts = []
        for run in runs:
            env = dict(os.environ)
            env.update(RUN_ENV.get(run, {}))
            tier = "fast" if run.startswith("fast") else run
            cmd = child_command(args, name, tier)
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                sys.stderr.write(out.stdout + out.stderr)
                raise SystemExit(f"{name} / {run}: the child process failed (exit {out.returncode})")
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
            res = json.loads(line)
            for key in ("ms", "spread", "faults_mib", "peak", "first_loss"):
                res[key] = {(run if k == tier else k): v for k, v in res.get(key, {}).items()}
            parts.append(res)
            ms = res["ms"].get(run)
            print(f"  {name} / {run}: {_f(ms, '.1f')} ms  [{res.get('describe', '')}]", flush=True)
        results.append(merge(parts))
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated, from {', '.join(MODELS)} (mixer/gmlp/amlp = the CIFAR ones)")
    parser.add_argument("--runs", default=None,
                        help="comma-separated, from fast, reference, torch, matmul, torch-matmul (and in --solo mode "
                             f"{', '.join(k for k in RUN_ENV if k.startswith('fast-'))}); "
                             "default: fast,reference,torch,matmul")
    parser.add_argument("--solo", action="store_true", help="each run in its own process")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default 10 CIFAR, 30 small)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--gap", type=float, default=0.25, help="idle seconds before every timed step (0.25)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time (default) or the process's CPU time (with --threads 1, on a busy machine)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for NumPy's BLAS, numba and PyTorch (default: NumPy's BLAS default)")
    parser.add_argument("--memory", action="store_true", help="also measure each step's peak bytes")
    parser.add_argument("--profile", action="store_true",
                        help="also time the fast step op by op (forward and backward of each op, the engine, "
                             "the optimizer) beside the matmul floor")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models (8 x 8 images, width 8, depth 2), 2 steps, no gap: a smoke test")
    parser.add_argument("--show-config", action="store_true", help="print numpy.show_config() in full first")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = args.steps or 2
        args.warmup = min(args.warmup, 1)
        args.gap = 0.0 if "--gap" not in (argv or sys.argv) else args.gap
    models = [ALIASES.get(m.strip(), m.strip()) for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in MODELS:
            parser.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    runs = [r.strip() for r in (args.runs or "fast,reference,torch,matmul").split(",") if r.strip()]
    for r in runs:
        if r not in RUN_ENV and r not in FLOORS:
            parser.error(f"unknown run {r!r}; choose from fast, reference, torch, matmul, torch-matmul, "
                         + ", ".join(k for k in RUN_ENV if k.startswith("fast-")))
        if r.startswith("fast-") and r != "fast-nonumba" and not args.solo:
            parser.error(f"run {r!r} sets environment variables read at import: use it with --solo")

    blas = OpenBLAS()
    if args.threads is not None:
        try:
            from threadpoolctl import threadpool_limits
            threadpool_limits(args.threads, user_api="blas")
        except ImportError:
            blas.threads = args.threads
    torch = None
    if "torch" in runs or "torch-matmul" in runs:
        try:
            import torch
        except ImportError:
            torch = None
            if not args.child:
                print("PyTorch is not installed: the torch runs are skipped (pip install torch)")
            runs = [r for r in runs if r not in ("torch", "torch-matmul")]
    if torch is not None:
        threads = args.threads or blas.threads
        if threads:
            torch.set_num_threads(threads)
    compiled = getattr(fast, "compiled", None)
    if args.threads and compiled is not None and hasattr(compiled, "set_threads"):
        compiled.set_threads(args.threads)

    if args.child:
        res = bench_model(models[0], runs, args, torch)
        res["describe"] = f"{numba_state()}; {memory_state()}"
        print(json.dumps(res))
        return 0

    if args.show_config:
        np.show_config()
        print()
    print_header(blas, torch, args, runs)
    if args.solo:
        results = run_solo(args, models, runs)
    else:
        results = []
        for name in models:
            res = bench_model(name, runs, args, torch)
            results.append(res)
            print(f"  {name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in res["ms"].items()), flush=True)
    print(f"  load average {', '.join(f'{v:.2f}' for v in os.getloadavg())} at the end")
    print()
    print_table(results, runs, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
