"""What the in-place guard costs a training step, measured in one process.

The guard (tinymlp/guard.py) records, for every input a forward saves, its storage's version
and, when the step reads ``.data`` after the save, a CRC-32 of the saved array; ``backward``
compares both before it uses the array. This script times the fast step of each model with the
guard as it is and with its four hooks replaced by no-ops (``record``, ``share_views``,
``check_unmodified``, ``before_raw_access``), alternating the two step by step on the same
weights, and prints the medians and their ratio: the guard's cost, with the machine's noise
shared by both.

    python benchmarks/guard_cost.py                       # the three CIFAR presets and the small ones
    python benchmarks/guard_cost.py --models gmlp_mnist --steps 40
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tinymlp  # noqa: E402
from tinymlp import guard  # noqa: E402
from tinymlp.optim import AdamW  # noqa: E402

import cpu_step  # noqa: E402


@contextlib.contextmanager
def guard_off():
    """The step without the guard: its hooks in tinymlp.guard made no-ops for a while."""
    hooks = dict(record=lambda ctx, args, arrays, kwargs=None: (), share_views=lambda result, out, args, arrays: None,
                 check_unmodified=lambda node, last=False: None, before_raw_access=lambda storage: None)
    saved = {name: getattr(guard, name) for name in hooks}
    for name, fn in hooks.items():
        setattr(guard, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(guard, name, fn)


def measure(name, steps, warmup, batch):
    preset, overrides, _ = cpu_step.model_config(name, quick=False)
    model = cpu_step.create(preset, **overrides)
    rng = np.random.default_rng(0)
    size, channels = model.config["image_size"], model.config["in_channels"]
    x = tinymlp.tensor(rng.standard_normal((batch, channels, size, size)).astype(np.float32))
    y = rng.integers(0, 10, batch)
    opt = AdamW(model.parameters(), lr=cpu_step.LR, weight_decay=cpu_step.WEIGHT_DECAY)
    times = {"guard on": [], "guard off": []}
    for i in range(warmup + steps):
        for label in (("guard on", "guard off") if i % 2 == 0 else ("guard off", "guard on")):
            context = guard_off() if label == "guard off" else contextlib.nullcontext()
            with context:
                start = time.perf_counter()
                cpu_step.tinymlp_step(model, opt, x, y)
                elapsed = time.perf_counter() - start
            if i >= warmup:
                times[label].append(elapsed * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mixer_cifar,gmlp_cifar,amlp_cifar,mixer_mnist,gmlp_mnist,amlp_mnist")
    parser.add_argument("--steps", type=int, default=None, help="timed steps of each kind (default 8 CIFAR, 30 small)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    print(f"CPU      {cpu_step.cpu_model()}")
    print(f"load     {', '.join(f'{v:.2f}' for v in os.getloadavg())} (1, 5, 15 min) at the start")
    print(f"tinymlp  fast tier {'on' if tinymlp.fast.is_enabled() else 'off'}; batch {args.batch_size}, "
          "float32; median ms of a step, the two kinds alternating on the same weights\n")
    print(f"{'model':12s} {'guard on':>10s} {'guard off':>10s} {'cost':>8s}")
    for name in args.models.split(","):
        steps = args.steps or (8 if name.endswith("cifar") else 30)
        ms = measure(name, steps, args.warmup, args.batch_size)
        cost = ms["guard on"] / ms["guard off"] - 1
        print(f"{name:12s} {ms['guard on']:10.1f} {ms['guard off']:10.1f} {cost:+8.1%}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
