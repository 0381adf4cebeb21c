"""Forward + backward time of the fused SGU, cross-entropy and dropout against the same math
composed from tinymlp's primitives and (when installed) PyTorch on the CPU, in one process.

    python benchmarks/ops_gating.py [--repeats 7] [--dtype float32]     (after pip install -e .)

Shapes are those of the CIFAR gMLP (batch 64, 64 tokens, d_ffn 768 so z is (64, 64, 768)).
Times are medians in milliseconds; numbers depend on the BLAS (printed first).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tinymlp
import tinymlp.functional as F
from tinymlp import tensor

try:
    import torch
except ImportError:  # PyTorch is optional
    torch = None


def median_ms(step, repeat):
    step()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


# --------------------------------------------------------------------------- composed versions
def composed_layer_norm(x, weight, bias, eps):
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    var = (xc * xc).mean(axis=-1, keepdims=True)
    return xc / (var + eps).sqrt() * weight + bias


def composed_sgu(z, weight, bias, norm_weight, norm_bias, eps=1e-5):
    e = z.shape[-1] // 2
    z1, z2 = z[..., :e], z[..., e:]
    n = composed_layer_norm(z2, norm_weight, norm_bias, eps)
    return z1 * (weight @ n + bias.reshape(-1, 1))


def composed_cross_entropy(logits, y):
    B = logits.shape[0]
    s = logits - logits.max(axis=1, keepdims=True).detach()
    log_p = s - s.exp().sum(axis=1, keepdims=True).log()
    return -log_p[np.arange(B), y].mean()


def composed_dropout(x, p, rng):
    mask = (rng.random(x.shape, dtype=x.dtype) >= p).astype(x.dtype) / (1 - p)
    return x * mask


# --------------------------------------------------------------------------- cases
def run_backward(fn, inputs, grad):
    for t in inputs:
        t.grad = None
    out = fn(*inputs)
    out.backward(grad)


def cases(dtype, rng):
    B, S, e, K = 64, 64, 384, 10
    leaf = lambda a: tensor(a, requires_grad=True, dtype=dtype)  # noqa: E731
    z = rng.normal(size=(B, S, 2 * e))
    W, b = rng.normal(size=(S, S)) * 1e-2, np.ones(S)
    g, be = np.ones(e), np.zeros(e)
    sgu_inputs = [leaf(a) for a in (z, W, b, g, be)]
    sgu_grad = rng.normal(size=(B, S, e)).astype(dtype)

    logits = [leaf(rng.normal(size=(256, 1000)))]
    y = rng.integers(0, 1000, size=256)
    drop_x = [leaf(rng.normal(size=(B, S, 256)))]
    drop_grad = rng.normal(size=(B, S, 256)).astype(dtype)

    yield ("spatial_gating (64,64,768)",
           lambda: run_backward(F.spatial_gating, sgu_inputs, sgu_grad),
           lambda: run_backward(composed_sgu, sgu_inputs, sgu_grad),
           torch and torch_sgu(z, W, b, g, be, sgu_grad, dtype))
    yield ("cross_entropy (256,1000)",
           lambda: run_backward(lambda x: F.cross_entropy(x, y), logits, None),
           lambda: run_backward(lambda x: composed_cross_entropy(x, y), logits, None),
           torch and torch_ce(logits[0].numpy(), y))
    yield ("dropout p=0.1 (64,64,256)",
           lambda: run_backward(lambda x: F.dropout(x, 0.1, rng=rng), drop_x, drop_grad),
           lambda: run_backward(lambda x: composed_dropout(x, 0.1, rng), drop_x, drop_grad),
           torch and torch_dropout(drop_x[0].numpy(), drop_grad))


# --------------------------------------------------------------------------- PyTorch
def torch_sgu(z, W, b, g, be, grad, dtype):
    tdt = getattr(torch, dtype)
    ts = [torch.tensor(a, dtype=tdt, requires_grad=True) for a in (z, W, b, g, be)]
    tg = torch.from_numpy(grad)
    e = z.shape[-1] // 2

    def step():
        for t in ts:
            t.grad = None
        zt, Wt, bt, gt, bet = ts
        n = torch.nn.functional.layer_norm(zt[..., e:], (e,), gt, bet, 1e-5)
        out = zt[..., :e] * (torch.matmul(Wt, n) + bt[:, None])
        out.backward(tg)
    return step


def torch_ce(logits, y):
    x = torch.tensor(logits, requires_grad=True)
    ty = torch.from_numpy(y)

    def step():
        x.grad = None
        torch.nn.functional.cross_entropy(x, ty).backward()
    return step


def torch_dropout(x, grad):
    tx = torch.tensor(x, requires_grad=True)
    tg = torch.from_numpy(grad)

    def step():
        tx.grad = None
        torch.nn.functional.dropout(tx, 0.1, training=True).backward(tg)
    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per entry (median reported)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args()

    cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    print(f"tinymlp {tinymlp.__version__}, NumPy {np.__version__} ({cfg.get('name')} {cfg.get('version')}), "
          f"PyTorch {torch.__version__ if torch else 'not installed'}, {args.dtype}, median of {args.repeats}")
    print(f"{'op (forward + backward)':32s} {'fused ms':>9s} {'composed ms':>12s} {'PyTorch ms':>11s}")
    for name, fused, composed, theirs in cases(args.dtype, np.random.default_rng(0)):
        t_fused = median_ms(fused, args.repeats)
        t_comp = median_ms(composed, args.repeats)
        t_torch = f"{median_ms(theirs, args.repeats):11.2f}" if theirs else f"{'-':>11s}"
        print(f"{name:32s} {t_fused:9.2f} {t_comp:12.2f} {t_torch}")


if __name__ == "__main__":
    main()
