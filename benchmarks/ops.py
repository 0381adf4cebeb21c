"""Fused ops against the same math composed from tinymlp primitives, and against PyTorch (CPU).

Sizes are those of the CIFAR MLP-Mixer (batch 64, 64 tokens, 256 channels, channel-MLP hidden
1024) and of aMLP's tiny attention (64 tokens, width 64), in float32. Each entry is the median
time of forward + backward (with a random upstream gradient) over several runs, all measured in
this one process. Run:  python benchmarks/ops.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np

import tinymlp
import tinymlp.functional as F
from tinymlp import tensor

try:
    import torch
except ImportError:  # PyTorch is optional: its column is then left out
    torch = None

B, S, C, H = 64, 64, 256, 1024  # batch, tokens, channels, channel-MLP hidden
D_ATTN = 64                    # aMLP tiny-attention width
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


# ----------------------------------------------------------------------------- cases
def cases(rng):
    """name -> (shapes of the inputs, fused fn, composed fn, torch fn or None)."""
    tf = torch.nn.functional if torch is not None else None
    return {
        "linear": (
            [(B, S, C), (C, H), (H,)], F.linear, composed_linear,
            tf and (lambda x, w, b: x @ w + b),
        ),
        "gelu (tanh)": (
            [(B * S, H)], F.gelu, composed_gelu,
            tf and (lambda x: tf.gelu(x, approximate="tanh")),
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
    }


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


def blas_name():
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{info.get('name')} {info.get('version')}"
    except (TypeError, KeyError):  # older NumPy
        return "unknown"


def openblas(verb):
    """OpenBLAS's ``get_num_threads`` or ``set_num_threads`` function from the library NumPy
    loaded (Linux), or None where it cannot be found."""
    import ctypes  # noqa: PLC0415

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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per entry (median reported)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for NumPy's OpenBLAS and for PyTorch (default: leave both as they are)")
    args = parser.parse_args()
    if args.threads is not None:
        setter = openblas("set")
        if setter is not None:
            setter(args.threads)
        if torch is not None:
            torch.set_num_threads(args.threads)
    getter = openblas("get")

    rng = np.random.default_rng(0)
    print(f"tinymlp {tinymlp.__version__}, NumPy {np.__version__} (BLAS: {blas_name()}, "
          f"{getter() if getter else '?'} threads), {os.cpu_count()} CPU cores")
    if torch is not None:
        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads")
    else:
        print("PyTorch not installed: its column is left out")
    print(f"float32, forward + backward, median of {args.repeats} runs, milliseconds\n")

    header = f"{'op':<14}{'shapes':<34}{'fused':>9}{'composed':>10}{'speed-up':>10}"
    if torch is not None:
        header += f"{'torch':>9}{'fused/torch':>13}"
    print(header)
    print("-" * len(header))
    for name, (shapes, fused, composed, torch_fn) in cases(rng).items():
        arrays = [rng.standard_normal(s, dtype=np.float32) for s in shapes]
        out_shape = fused(*[tensor(a) for a in arrays]).shape
        grad = rng.standard_normal(out_shape, dtype=np.float32)
        t_fused = median_ms(tinymlp_step(fused, arrays, grad), args.repeats)
        t_comp = median_ms(tinymlp_step(composed, arrays, grad), args.repeats)
        shape_text = " ".join("x".join(map(str, s)) for s in shapes)
        row = f"{name:<14}{shape_text:<34}{t_fused:>9.2f}{t_comp:>10.2f}{t_comp / t_fused:>9.2f}x"
        if torch is not None:
            t_torch = median_ms(torch_step(torch_fn, arrays, grad), args.repeats)
            row += f"{t_torch:>9.2f}{t_fused / t_torch:>12.2f}x"
        print(row)


if __name__ == "__main__":
    main()
