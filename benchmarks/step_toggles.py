"""One CPU training step with one of the fast tier's savings switched on and off, step by step,
in one process: the instrument for changes smaller than a shared machine's noise.

``cpu_step.py``'s rounds compare whole steps run minutes apart; on a shared 2-core machine one
unchanged tree's own work moves by 15-30% between rounds, so a change worth 1-3% of a step is
invisible there. Here the same model, weights and batch run with the feature on, then off, then
off, then on (ABBA), with the same idle gap before every step as ``cpu_step.py``: both sides see
the same machine within seconds. Printed: the median and the fastest step of each side, and the
median of the per-pair differences (on - off). ``--clock cpu`` times the process's CPU time instead
of the wall clock: with one thread for NumPy's BLAS and numba (``OPENBLAS_NUM_THREADS=1
NUMBA_NUM_THREADS=1``), other processes on the machine move it much less.

Toggles (each switched off by making its hook decline):

- ``guard-frees``: the in-place guard releases a node's records (and so its saved arrays) before
  its last backward (off: it keeps them through it, until its storages' lists are next pruned,
  so the early frees of backward free nothing);
- ``pending-bias``: a Linear's bias added by the op after it (off: added on its own);
- ``whole-adam``: AdamW's step as one compiled pass per 16 parameters (off: the direction over the
  flat buffers, then one launch per parameter).

    python benchmarks/step_toggles.py --toggle pending-bias --models mixer_cifar,mixer_mnist
    OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python benchmarks/step_toggles.py --toggle pending-bias \
        --clock cpu --pairs 20 --gap 0.05 --models mixer_mnist,gmlp_mnist,amlp_mnist
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
from tinymlp.fast import activation, elementwise, gating, optim  # noqa: E402


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


TOGGLES = {   # name -> a context manager factory that switches the feature off
    "guard-frees": _guard_keeps,
    "pending-bias": _no_pending_bias,
    "whole-adam": lambda: _replaced(optim.CompiledFlatStep, "whole_step", staticmethod(_declines)),
}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def timed(step, off, gap, clock=time.perf_counter):
    """One step's seconds, with the feature off when ``off``."""
    with TOGGLES[off]() if off else contextlib.nullcontext():
        time.sleep(gap)
        start = clock()
        step()
        return clock() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toggle", choices=sorted(TOGGLES), required=True)
    parser.add_argument("--models", default="mixer_cifar,gmlp_cifar,amlp_cifar,mixer_mnist,gmlp_mnist,amlp_mnist")
    parser.add_argument("--pairs", type=int, default=12, help="ABBA pairs of steps per model (default 12)")
    parser.add_argument("--gap", type=float, default=0.25, help="idle seconds before every step (0.25)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time (default) or the process's CPU time (steadier on a busy machine)")
    parser.add_argument("--quick", action="store_true", help="tiny models, 2 pairs, no gap: a smoke test")
    args = parser.parse_args(argv)
    clock = CLOCKS[args.clock]
    pairs, gap = (2, 0.0) if args.quick else (args.pairs, args.gap)
    print(f"CPU      {cpu_step.cpu_model()}")
    print(f"NumPy    {cpu_step.blas_description(cpu_step.OpenBLAS())}")
    print(f"tinymlp  {cpu_step.numba_state()}")
    print(f"toggle   {args.toggle}: on and off in turn (ABBA), {pairs} pairs, {gap} s idle before every step, "
          f"{args.clock} time")
    print()
    for name in args.models.split(","):
        step = cpu_step.build(name, ["fast"], args.batch_size, args.quick, None)["fast"]
        for off in (None, args.toggle):             # warm-up: compile, fill the heap, both ways
            timed(step, off, 0.0, clock)
        on_s, off_s = [], []
        for i in range(pairs):
            order = (None, args.toggle) if i % 2 == 0 else (args.toggle, None)
            for off in order:
                (off_s if off else on_s).append(timed(step, off, gap, clock))
        diff = statistics.median(a - b for a, b in zip(on_s, off_s)) * 1e3
        print(f"  {name:12s} on {statistics.median(on_s) * 1e3:8.1f} ms (fastest {min(on_s) * 1e3:7.1f})   "
              f"off {statistics.median(off_s) * 1e3:8.1f} ms (fastest {min(off_s) * 1e3:7.1f})   "
              f"on - off, median of pairs {diff:+7.1f} ms")


if __name__ == "__main__":
    main()
