"""The text examples, run end to end in a subprocess on generated text (CPU, no network):
masked-LM pretraining with perplexity, fine-tuning from it, classification, resume, and the
offline error for a real data set that is not on disk."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinymlp.checkpoint import read_meta
from tinymlp.data.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
MLM = ROOT / "examples" / "pretrain_mlm.py"
CLS = ROOT / "examples" / "train_text_gmlp.py"
TINY = ["--seq-len", "16", "--dim", "16", "--depth", "2", "--ffn-dim", "32", "--vocab-size", "120",
        "--batch-size", "16", "--limit-batches", "3", "--no-progress"]


def run(script, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TINYMLP_DATA": str(cwd / "no-data-here")}
    result = subprocess.run([sys.executable, str(script), *map(str, args)], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300, check=False)
    return result


def ok(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_pretrain_resume_then_finetune(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the film number {i % 7} was {'good' if i % 3 else 'bad'} ." for i in range(120)))
    mlm = tmp_path / "mlm"
    out = ok(run(MLM, "--text", corpus, *TINY, "--epochs", "1", "--out", mlm, cwd=tmp_path))
    assert "held-out perplexity" in out
    assert Tokenizer.load(mlm / "tokenizer.json").vocab_size <= 120
    out = ok(run(MLM, "--text", corpus, *TINY, "--epochs", "2", "--out", mlm, "--resume", "auto", cwd=tmp_path))
    assert "resuming" in out and read_meta(mlm / "checkpoint.npz")["epoch"] == 2
    metrics = json.loads((mlm / "metrics.json").read_text())
    assert len(metrics["history"]["val_loss"]) == 2

    fine = tmp_path / "fine"
    out = ok(run(CLS, "--dataset", "synthetic", "--synthetic-size", "64", "--epochs", "1", "--batch-size", "16",
                 "--no-progress", "--pretrained", mlm / "checkpoint.npz", "--out", fine, cwd=tmp_path))
    assert "pretrained weights" in out and "test accuracy" in out
    assert (fine / "tokenizer.json").read_text() == (mlm / "tokenizer.json").read_text()


@pytest.mark.slow
def test_classifier_amlp_on_pairs_and_resume(tmp_path):
    out_dir = tmp_path / "cls"
    args = ["--dataset", "synthetic", "--synthetic-task", "pairs", "--synthetic-size", "96", *TINY,
            "--attn-dim", "8", "--out", out_dir]
    ok(run(CLS, *args, "--epochs", "1", cwd=tmp_path))
    for name in ("checkpoint.npz", "metrics.json", "curves.png", "tokenizer.json"):
        assert (out_dir / name).stat().st_size > 0
    out = ok(run(CLS, *args, "--epochs", "2", "--resume", "auto", cwd=tmp_path))
    assert "resuming" in out
    meta = read_meta(out_dir / "checkpoint.npz")
    assert meta["epoch"] == 2 and meta["model_config"]["attn_dim"] == 8


def test_offline_without_data_is_a_clear_error(tmp_path):
    result = run(CLS, "--dataset", "polarity", "--no-download", *TINY, "--out", tmp_path / "x", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--data-dir" in result.stderr and "--dataset synthetic" in result.stderr
    result = run(MLM, "--dataset", "text", *TINY, cwd=tmp_path)
    assert result.returncode == 2 and "--text FILE" in result.stderr


def test_image_only_flags_are_hidden_from_text_help_and_refused(tmp_path):
    result = run(CLS, "--help", cwd=tmp_path)
    assert result.returncode == 0 and "--attn-dim" in result.stdout
    for flag in ("--flip", "--mixup", "--cutmix", "--optimizer", "--schedule"):
        assert flag not in result.stdout
    for flags in (["--mixup", "0.2"], ["--optimizer", "sgd"]):
        result = run(CLS, "--dataset", "synthetic", *flags, cwd=tmp_path)
        assert result.returncode == 2 and flags[0] in result.stderr and "Traceback" not in result.stderr
