"""What a passing default ``gradcheck`` costs, on layers a student checks: median seconds per call.

Each case is a correct layer checked with the default options (so every check a passing call
makes is timed: forward sanity, backward three times and once watched, the state checks, the
finite differences, ties at kinks). ``--code DIR`` imports tinymlp from DIR instead of this
checkout, so that two versions can be timed in turn on the same machine:

    git archive <commit> tinymlp | tar -x -C /tmp/old
    python benchmarks/gradcheck_cost.py --code /tmp/old
    python benchmarks/gradcheck_cost.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cases(tinymlp, layers):
    from tinymlp import nn

    rng = __import__("numpy").random.default_rng(0)

    def x(*shape):
        return tinymlp.tensor(rng.normal(size=shape), requires_grad=True, dtype="float64")

    return {
        "gelu (8,32)": (tinymlp.functional.gelu, (x(8, 32),)),
        "nn.Linear(16,16) (8,16)": (nn.Linear(16, 16, rng=rng), (x(8, 16),)),
        "nn.LayerNorm(32) (4,8,32)": (nn.LayerNorm(32), (x(4, 8, 32),)),
        "nn.MultiHeadSelfAttention(8,2) (2,4,8)": (nn.MultiHeadSelfAttention(8, 2, rng=rng), (x(2, 4, 8),)),
        "student GroupNorm (2,6,4)": (layers.GroupNorm.apply, (x(2, 6, 4), x(6), x(6))),
        "student causal attention (2,4,3) x3": (layers.CausalAttention.apply, (x(2, 4, 3), x(2, 4, 3), x(2, 4, 3))),
        "student residual block x + leaky(x W + b)": (layers.residual_block(layers.LeakyReLU),
                                                      (x(3, 4), x(4, 4), x(4))),
        "student max-pool with ties (2,3,8)": (layers.MaxPool1d.apply, (layers.after_relu((2, 3, 8), 12),)),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", default=ROOT, help="a directory holding the tinymlp package to time")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    sys.path.insert(0, os.path.abspath(args.code))
    import tinymlp

    import gradcheck_layers as layers

    print(f"tinymlp from {os.path.dirname(tinymlp.__file__)}; median of {args.repeat} calls")
    for name, (fn, inputs) in cases(tinymlp, layers).items():
        times = []
        for _ in range(args.repeat + 1):
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = tinymlp.gradcheck(fn, inputs, raise_on_fail=False)
            times.append(time.perf_counter() - start)
        assert report.passed, report.summary()
        print(f"  {name:<52} {1000 * statistics.median(times[1:]):8.1f} ms")


if __name__ == "__main__":
    main()
