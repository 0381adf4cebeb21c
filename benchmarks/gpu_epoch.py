"""A CIFAR-sized Mixer epoch through the whole pipeline on the GPU, with and without the CUDA graph.

Runs ``examples/train_cifar_mixer.py`` on the synthetic set (50,000 images by default, the size
of CIFAR-10's training set; no download) as a user would, twice: with the step captured into a
CUDA graph (the default) and with ``--no-graph``. Each run trains a few epochs: the first one
compiles the kernels (its first step is timed apart) and captures the graph; the last one is the
steady rate. Printed per run: each epoch's training images/s (the loader's upload, crop, flip and
normalisation on the GPU, the step, the metrics), its time, how its steps ran, and the time a
50,000-image epoch takes at the steady rate (goal: under 4.5 s on an H100). Validation and the
test set are left out of the rate (``--val-fraction 0``; the test set is evaluated once at the end).

    python benchmarks/gpu_epoch.py                                  # 50,000 images, batch 128, 2 epochs
    python benchmarks/gpu_epoch.py --images 10000 --epochs 3 --device cpu   # the same on the CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EPOCH_IMAGES = 50_000
GOAL_SECONDS = 4.5


def run(args, graph, out):
    command = [sys.executable, str(ROOT / "examples" / "train_cifar_mixer.py"), "--device", args.device,
               "--dataset", "synthetic", "--synthetic-size", str(args.images), "--val-fraction", "0",
               "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--no-progress",
               "--out", str(out)] + ([] if graph else ["--no-graph"]) + args.extra
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        print(f"FAILED ({done.returncode}): {' '.join(command)}\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
        return None
    return json.loads((out / "metrics.json").read_text(encoding="utf-8"))["history"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=EPOCH_IMAGES, help="synthetic images (default 50,000)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--ways", default="graph,eager", help="graph, eager (--no-graph), or both")
    parser.add_argument("extra", nargs="*", help="more flags for the example script (after --)")
    args = parser.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for way in [w.strip() for w in args.ways.split(",") if w.strip()]:
            history = run(args, way == "graph", Path(tmp) / way)
            if history is None:
                failed = True
                continue
            for k, epoch in enumerate(history["epoch"]):
                first = history["warmup_time"][k]
                print(f"{way:5s} epoch {epoch}: {history['images_per_sec'][k]:9,.0f} img/s, "
                      f"{history['epoch_time'][k]:6.1f} s" + (f" (first step {first:.1f} s apart)" if first else "")
                      + (f" | {history['graph'][k]}" if history.get("graph", [None] * (k + 1))[k] else ""))
            steady = history["images_per_sec"][-1]
            projected = EPOCH_IMAGES / steady
            verdict = "" if args.device != "cuda" else \
                f" (goal on an H100: under {GOAL_SECONDS} s: {'met' if projected < GOAL_SECONDS else 'NOT met'})"
            print(f"{way:5s} a {EPOCH_IMAGES:,}-image epoch at the last epoch's rate: {projected:.2f} s{verdict}",
                  flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
