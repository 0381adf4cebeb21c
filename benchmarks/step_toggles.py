"""One CPU training step with one of the fast tier's hand-overs switched on and off, step by
step, in one process: the instrument for changes smaller than a shared machine's noise.

``cpu_step.py``'s rounds compare whole steps run minutes apart; on a shared 2-core machine one
unchanged tree's own work moves by 15-30% between rounds, so a change worth 1-3% of a step is
invisible there. Here the same model, weights and batch run with the feature on, then off, then
off, then on (ABBA), with the same idle gap before every step as ``cpu_step.py``: both sides see
the same machine within seconds. Printed: the median and the fastest step of each side, and the
median of the per-pair differences (on - off).

Toggles (each switched off by making its hook decline):

- ``guard-frees``: the in-place guard releases a node's records (and so its saved arrays) before
  its last backward (off: it keeps them through it, until its storages' lists are next pruned,
  so the early frees of backward free nothing);
- ``gelu-to-sgu``: GELU hands its dy/dx to the spatial gating unit (off: GELU's own backward);
- ``ln-adds``: LayerNorm's backward adds dx into the residual path's gradient (``backward_into``;
  off: the engine sums dx and that gradient in a pass of its own);
- ``pending-bias``: a Linear's bias added by the op after it (off: added on its own);
- ``sums-into-views``: the engine sums gradients that meet into a view of an array only that view
  holds (a Linear's reshaped dL/dx) as into a whole array (off: into whole arrays only, a new
  array for the sum otherwise);
- ``sums-in-place``: the engine sums gradients that meet into the first one wherever only it holds
  that array (off: every sum a new array, as the reference engine does);
- ``whole-adam``: AdamW's step as one compiled pass per 16 parameters (off: the direction over the
  flat buffers, then one launch per parameter).

    python benchmarks/step_toggles.py --toggle ln-adds --models mixer_cifar,mixer_mnist
    python benchmarks/step_toggles.py --toggle gelu-to-sgu --models gmlp_cifar --pairs 20
    python benchmarks/step_toggles.py --toggle whole-adam --models mixer_mnist,amlp_mnist --pairs 40
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cpu_step  # noqa: E402 (puts the checkout on the path first)

from tinymlp import guard  # noqa: E402
from tinymlp.fast import activation, elementwise, engine, gating, optim  # noqa: E402


def _declines(*args, **kwargs):
    return None


@contextlib.contextmanager
def _replaced(owner, name, value):
    old = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def _guard_keeps():
    check = guard.check_unmodified
    return _replaced(guard, "check_unmodified", lambda node, last=False: check(node, last=False))


def _no_pending_bias():
    stack = contextlib.ExitStack()
    for cls in (activation.CompiledGELU, elementwise.CompiledAdd, gating.CompiledSpatialGating):
        stack.enter_context(_replaced(cls, "takes_bias", staticmethod(_declines)))
    return stack


def _whole_arrays_only(g):
    """The engine's test before views: a whole writable array that only its sums hold (called in
    ``sole``'s place, so the reference counts are the same)."""
    return g.base is None and getattr(g.flags, "writeable", True) and sys.getrefcount(g) <= 4


TOGGLES = {   # name -> a context manager factory that switches the feature off
    "guard-frees": _guard_keeps,
    "gelu-to-sgu": lambda: _replaced(gating.CompiledSpatialGating, "takes_derivative", staticmethod(_declines)),
    "ln-adds": lambda: _replaced(engine.FastEngine, "offer_sum", lambda self, node, grads: None),
    "pending-bias": _no_pending_bias,
    "sums-into-views": lambda: _replaced(engine, "sole", _whole_arrays_only),
    "sums-in-place": lambda: _replaced(engine, "sole", lambda g: False),
    "whole-adam": lambda: _replaced(optim.CompiledFlatStep, "whole_step", staticmethod(_declines)),
}


def timed(step, off, gap):
    """One step's seconds, with the feature off when ``off``."""
    with TOGGLES[off]() if off else contextlib.nullcontext():
        time.sleep(gap)
        start = time.perf_counter()
        step()
        return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toggle", choices=sorted(TOGGLES), required=True)
    parser.add_argument("--models", default="mixer_cifar,gmlp_cifar,amlp_cifar,mixer_mnist,gmlp_mnist,amlp_mnist")
    parser.add_argument("--pairs", type=int, default=12, help="ABBA pairs of steps per model (default 12)")
    parser.add_argument("--gap", type=float, default=0.25, help="idle seconds before every step (0.25)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 pairs, no gap: a smoke test")
    args = parser.parse_args(argv)
    pairs, gap = (2, 0.0) if args.quick else (args.pairs, args.gap)
    print(f"CPU      {cpu_step.cpu_model()}")
    print(f"NumPy    {cpu_step.blas_description(cpu_step.OpenBLAS())}")
    print(f"tinymlp  {cpu_step.numba_state()}")
    print(f"toggle   {args.toggle}: on and off in turn (ABBA), {pairs} pairs, {gap} s idle before every step")
    print()
    for name in args.models.split(","):
        step = cpu_step.build(name, ["fast"], args.batch_size, args.quick, None)["fast"]
        for off in (None, args.toggle):             # warm-up: compile, fill the heap, both ways
            timed(step, off, 0.0)
        on_s, off_s = [], []
        for i in range(pairs):
            order = (None, args.toggle) if i % 2 == 0 else (args.toggle, None)
            for off in order:
                (off_s if off else on_s).append(timed(step, off, gap))
        diff = statistics.median(a - b for a, b in zip(on_s, off_s)) * 1e3
        print(f"  {name:12s} on {statistics.median(on_s) * 1e3:8.1f} ms (fastest {min(on_s) * 1e3:7.1f})   "
              f"off {statistics.median(off_s) * 1e3:8.1f} ms (fastest {min(off_s) * 1e3:7.1f})   "
              f"on - off, median of pairs {diff:+7.1f} ms")


if __name__ == "__main__":
    main()
