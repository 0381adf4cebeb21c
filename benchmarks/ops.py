"""Fused ops against the same math composed from tinymlp primitives, and against PyTorch (CPU).

Sizes are those of the CIFAR MLP-Mixer (batch 64, 64 tokens, 256 channels, channel-MLP hidden
1024), of aMLP's tiny attention (64 tokens, width 64) and of the CIFAR gMLP's spatial gating
unit (z of shape (64, 64, 768), split into two halves of 384), in float32. GELU is the tanh
approximation. Each entry is the median time of forward + backward (with a random upstream
gradient) over several runs, all measured in this one process. Run:

    python benchmarks/ops.py [--repeats 7] [--threads N] [--ops softmax dropout ...]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

import tinymlp
import tinymlp.functional as F
from tinymlp import tensor

try:
    import torch
except ImportError:  # PyTorch is optional: its column is then left out
    torch = None

B, S, C, H = 64, 64, 256, 1024  # batch, tokens, channels, channel-MLP hidden
D_ATTN = 64                    # aMLP tiny-attention width
E = 384                        # gMLP gate width: z is (B, S, 2E)
K = 1000                       # classes of the cross-entropy case (batch 256)
P_DROP = 0.1
EPS = 1e-5


# ----------------------------------------------------------------------------- composed forms
# The same math as each fused op, written with Tensor operators: every step is a primitive
# op with its own backward, as a user without fused ops would write it.
def composed_linear(x, w, b):
    return x @ w + b


def composed_gelu(x):
    c0 = math.sqrt(2 / math.pi)
    return 0.5 * x * (1 + (c0 * (x + 0.044715 * x * x * x)).tanh())


def composed_layer_norm(x, w, b):
    xc = x - x.mean(axis=-1, keepdims=True)
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / (var + EPS).sqrt() * w + b


def composed_softmax(x):
    e = (x - x.max(axis=-1, keepdims=True).detach()).exp()
    return e / e.sum(axis=-1, keepdims=True)


def composed_attention(q, k, v):
    s = (q @ k.swapaxes(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
    return composed_softmax(s) @ v


def composed_spatial_gating(z, w, b, norm_w, norm_b):
    z1, z2 = z[..., :E], z[..., E:]
    return z1 * (w @ composed_layer_norm(z2, norm_w, norm_b) + b.reshape(-1, 1))


def composed_cross_entropy(logits, y):
    s = logits - logits.max(axis=1, keepdims=True).detach()
    log_p = s - s.exp().sum(axis=1, keepdims=True).log()
    return -log_p[np.arange(len(y)), y].mean()


def composed_dropout(x, rng):
    keep = (rng.random(x.shape, dtype=x.dtype) >= P_DROP).astype(x.dtype) / (1 - P_DROP)
    return x * keep


def torch_spatial_gating(z, w, b, norm_w, norm_b):
    n = torch.nn.functional.layer_norm(z[..., E:], (E,), norm_w, norm_b, EPS)
    return z[..., :E] * (w @ n + b[:, None])


# ----------------------------------------------------------------------------- cases
def cases(rng):
    """name -> (shapes of the float inputs, fused fn, composed fn, torch fn or None).

    ``--ops`` selects cases by the first word of their name."""
    tf = torch.nn.functional if torch is not None else None
    y = rng.integers(0, K, size=256)  # class ids: a constant, not a timed input
    return {
        "linear": (
            [(B, S, C), (C, H), (H,)], F.linear, composed_linear,
            tf and (lambda x, w, b: x @ w + b),
        ),
        "gelu (tanh)": (
            [(B * S, H)], F.gelu, composed_gelu,
            tf and (lambda x: tf.gelu(x, approximate="tanh")),
        ),
        "linear+gelu": (     # the channel MLP's first half: the fast tier adds the bias inside GELU's pass
            [(B, S, C), (C, H), (H,)], lambda x, w, b: F.gelu(F.linear(x, w, b)),
            lambda x, w, b: composed_gelu(composed_linear(x, w, b)),
            tf and (lambda x, w, b: tf.gelu(tf.linear(x, w.t(), b), approximate="tanh")),
        ),
        "layer_norm": (
            [(B, S, C), (C,), (C,)], F.layer_norm, composed_layer_norm,
            tf and (lambda x, w, b: tf.layer_norm(x, (C,), w, b, EPS)),
        ),
        "softmax": (
            [(B, S, S)], F.softmax, composed_softmax,
            tf and (lambda x: torch.softmax(x, dim=-1)),
        ),
        "attention": (
            [(B, S, D_ATTN)] * 3, F.attention, composed_attention,
            tf and (lambda q, k, v: tf.scaled_dot_product_attention(q, k, v)),
        ),
        "spatial_gating": (
            [(B, S, 2 * E), (S, S), (S,), (E,), (E,)], F.spatial_gating, composed_spatial_gating,
            tf and torch_spatial_gating,
        ),
        "cross_entropy": (
            [(len(y), K)], lambda x: F.cross_entropy(x, y), lambda x: composed_cross_entropy(x, y),
            tf and (lambda x: tf.cross_entropy(x, torch.from_numpy(y))),
        ),
        f"dropout p={P_DROP}": (
            [(B, S, C)], lambda x: F.dropout(x, P_DROP, rng=rng), lambda x: composed_dropout(x, rng),
            tf and (lambda x: tf.dropout(x, P_DROP)),
        ),
    }


# ----------------------------------------------------------------------------- timing
def median_ms(step, repeats):
    step()  # warm-up (first-touch of buffers, BLAS thread start)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def tinymlp_step(fn, arrays, grad):
    leaves = [tensor(a, requires_grad=True) for a in arrays]

    def step():
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(grad)

    return step


def torch_step(fn, arrays, grad):
    leaves = [torch.from_numpy(a).requires_grad_() for a in arrays]
    g = torch.from_numpy(grad)

    def step():
        for t in leaves:
            t.grad = None
        fn(*leaves).backward(g)

    return step


# ----------------------------------------------------------------------------- BLAS threads
def blas_name():
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    except (TypeError, KeyError):  # older NumPy
        return "unknown"


def openblas(verb):
    """OpenBLAS's ``get_num_threads`` or ``set_num_threads`` function from the library NumPy
    loaded (Linux), or None where it cannot be found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
        for path in sorted(paths):
            lib = ctypes.CDLL(path)
            for name in (f"scipy_openblas_{verb}_num_threads64_", f"openblas_{verb}_num_threads64_",
                         f"openblas_{verb}_num_threads"):
                if hasattr(lib, name):
                    return getattr(lib, name)
    except OSError:
        pass
    return None


def main():
    rng = np.random.default_rng(0)
    all_cases = cases(rng)
    op_names = [name.split()[0] for name in all_cases]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per entry (median reported)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for NumPy's OpenBLAS and for PyTorch (default: leave both as they are)")
    parser.add_argument("--ops", nargs="+", choices=op_names, default=op_names, metavar="OP",
                        help=f"ops to time (default: all of {' '.join(op_names)})")
    args = parser.parse_args()
    if args.threads is not None:
        setter = openblas("set")
        if setter is not None:
            setter(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)
    getter = openblas("get")

    print(f"tinymlp {tinymlp.__version__}, NumPy {np.__version__} (BLAS: {blas_name()}, "
          f"{getter() if getter else '?'} threads), {os.cpu_count()} CPU cores")
    if torch is not None:
        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads")
    else:
        print("PyTorch not installed: its column is left out")
    print(f"float32, forward + backward, median of {args.repeats} runs, milliseconds\n")

    header = f"{'op':<16}{'shape':<30}{'fused':>9}{'composed':>10}{'speed-up':>10}"
    if torch is not None:
        header += f"{'torch':>9}{'fused/torch':>13}"
    print(header)
    print("-" * len(header))
    for name, (shapes, fused, composed, torch_fn) in all_cases.items():
        if name.split()[0] not in args.ops:
            continue
        arrays = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
        out_shape = fused(*[tensor(a) for a in arrays]).shape
        grad = rng.standard_normal(out_shape, dtype=np.float32)
        t_fused = median_ms(tinymlp_step(fused, arrays, grad), args.repeats)
        t_comp = median_ms(tinymlp_step(composed, arrays, grad), args.repeats)
        shape_text = " ".join("x".join(map(str, s)) for s in shapes)
        row = f"{name:<16}{shape_text:<30}{t_fused:>9.2f}{t_comp:>10.2f}{t_comp / t_fused:>9.2f}x"
        if torch is not None:
            t_torch = median_ms(torch_step(torch_fn, arrays, grad), args.repeats)
            row += f"{t_torch:>9.2f}{t_fused / t_torch:>12.2f}x"
        print(row)


if __name__ == "__main__":
    main()
