"""What a passing default ``gradcheck`` costs, on layers a student checks: forwards and CPU time per call.

Each case is a correct layer checked with the default options (so every check a passing call
makes is counted: forward sanity, backward three times and once watched, the state checks, the
finite differences, ties at kinks). The number of forward calls is exact and machine-independent
(the finite differences are nearly all of the cost); the CPU time per call is the fastest and the
median of ``--repeat`` calls (the median moves by 20 % on a busy machine). ``--code DIR`` imports
tinymlp from DIR instead of this checkout, so that two versions can be timed in turn:

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

    from tinymlp.gradcheck.method import Evaluator

    calls = [0]
    outputs = Evaluator.outputs

    def counted(self):
        calls[0] += 1
        return outputs(self)

    Evaluator.outputs = counted  # counts every forward the check makes
    print(f"tinymlp from {os.path.dirname(tinymlp.__file__)}; CPU time over {args.repeat} calls")
    print(f"  {'case':<46} {'forwards':>8} {'fastest':>9} {'median':>9}")
    for name, (fn, inputs) in cases(tinymlp, layers).items():
        times = []
        for _ in range(args.repeat + 1):
            calls[0] = 0
            start = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = tinymlp.gradcheck(fn, inputs, raise_on_fail=False)
            times.append(time.process_time() - start)
        assert report.passed, report.summary()
        times = times[1:]  # the first call compiles and caches
        print(f"  {name:<46} {calls[0]:8d} {1000 * min(times):7.1f}ms {1000 * statistics.median(times):7.1f}ms")
    if os.path.exists(os.path.join(os.path.dirname(tinymlp.__file__), "gradcheck", "blame.py")):
        watch_cost(tinymlp)


def watch_cost(tinymlp, repeat=200):
    """The one step a passing check adds besides forwards: a backward watched node by node
    (``gradcheck/blame.py``), against a plain backward through the same graph."""
    import numpy as np

    from tinymlp import nn
    from tinymlp.grad_mode import enable_grad
    from tinymlp.gradcheck.blame import Watch, graph_nodes

    rng = np.random.default_rng(0)
    layer = nn.MultiHeadSelfAttention(8, 2, rng=rng)
    x = tinymlp.tensor(rng.normal(size=(2, 4, 8)), requires_grad=True)  # float32, as the layer's weights
    g = rng.normal(size=(2, 4, 8)).astype(np.float32)

    def once(watched):
        with enable_grad():
            y = layer(x)
        start = time.process_time()
        watch = Watch(graph_nodes([y])) if watched else None
        y.backward(g.copy(), retain_graph=True)
        if watch is not None:
            watch.restore()
        return time.process_time() - start

    plain, watched = zip(*[(once(False), once(True)) for _ in range(repeat)])
    print(f"  one backward of nn.MultiHeadSelfAttention(8,2): {1e6 * statistics.median(plain):.0f} us plain, "
          f"{1e6 * statistics.median(watched):.0f} us watched node by node (once per gradcheck call)")


if __name__ == "__main__":
    main()
