"""The example scripts, run end to end in a subprocess, as a user runs them (CPU, no network).

- each script trains a few batches on the synthetic set, writes its checkpoint, metrics.json
  and PNGs, and ``--resume`` continues from the checkpoint (epochs advance, metrics append);
- CIFAR requested offline with no copy on disk: exit status 2 and a message that says how to
  pass --data-dir or use --dataset synthetic, no traceback (the download goes to a local port
  where nothing listens, so the test never touches the network);
- ``--device cuda`` without a usable GPU: exit status 2, a clear message, no CuPy traceback.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tinymlp
from tinymlp.checkpoint import read_meta

ROOT = Path(__file__).resolve().parent.parent
MIXER = ROOT / "examples" / "train_cifar_mixer.py"
GMLP = ROOT / "examples" / "train_cifar_gmlp.py"

SMOKE = ["--dataset", "synthetic", "--synthetic-size", "200", "--batch-size", "16", "--limit-batches", "2",
         "--no-progress"]
TINY = {MIXER: ["--dim", "16", "--depth", "2", "--token-mlp-dim", "8", "--channel-mlp-dim", "32"],
        GMLP: ["--dim", "16", "--depth", "2", "--ffn-dim", "32"]}


def run(script, *args, cwd, env=None):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
                   "TINYMLP_DATA": str(cwd / "no-data-here"), **(env or {})}
    return subprocess.run([sys.executable, str(script), *map(str, args)], check=False, cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


def assert_ok(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def assert_clean_failure(result):
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr and result.stderr.startswith("error: ")


@pytest.mark.parametrize("script,extra,weight_png", [
    (MIXER, [], "token_mixing.png"),
    (GMLP, ["--attn-dim", "8", "--toeplitz", "2d"], "spatial_weights.png"),   # aMLP, Toeplitz weights
])
@pytest.mark.slow
def test_script_trains_writes_its_outputs_and_resumes(tmp_path, script, extra, weight_png):
    out = tmp_path / "run"
    first = run(script, *SMOKE, *TINY[script], *extra, "--epochs", "1", "--lr", "0.002", "--out", out,
                cwd=tmp_path)
    assert_ok(first)
    for name in ("checkpoint.npz", "metrics.json", "curves.png", weight_png):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    with open(out / "curves.png", "rb") as f:
        assert f.read(4) == b"\x89PNG"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["history"]["epoch"] == [1] and metrics["history"]["steps"] == [2]
    assert metrics["dataset"] == "synthetic" and metrics["model_config"]["dim"] == 16
    assert read_meta(out / "checkpoint.npz")["epoch"] == 1
    summary = first.stdout.strip().splitlines()[-1]
    assert summary.startswith("done: test accuracy") and "img/s" in summary and str(out) in summary
    if script is GMLP:
        assert metrics["model"] == "AMLP" and metrics["model_config"]["toeplitz"] == "2d"

    # continue to 3 epochs; the model flags are left out: the architecture comes from the checkpoint
    # (the gMLP run names the checkpoint and leaves --out out: the outputs go to its folder)
    where = ["--resume", "auto", "--out", out] if script is MIXER else ["--resume", out / "checkpoint.npz"]
    second = run(script, *SMOKE, "--epochs", "3", *where, cwd=tmp_path)
    assert_ok(second)
    assert "resuming" in second.stdout and "1 epoch done" in second.stdout
    metrics2 = json.loads((out / "metrics.json").read_text())
    assert metrics2["history"]["epoch"] == [1, 2, 3] and metrics2["history"]["steps"] == [2, 4, 6]
    assert metrics2["history"]["train_loss"][0] == metrics["history"]["train_loss"][0]  # appended, not redone
    assert metrics2["model_config"] == metrics["model_config"]
    assert read_meta(out / "checkpoint.npz")["epoch"] == 3
    assert metrics2["args"]["lr"] == 0.002 and "AdamW lr 0.002 " in second.stdout   # the run's lr, kept
    if script is MIXER:  # an lr given again on resume wins, and the banner says so
        third = run(script, *SMOKE, "--epochs", "4", "--lr", "0.004", *where, cwd=tmp_path)
        assert_ok(third)
        assert "AdamW lr 0.004 " in third.stdout
        assert json.loads((out / "metrics.json").read_text())["args"]["lr"] == 0.004


@pytest.mark.slow
def test_resume_auto_without_a_checkpoint_starts_afresh_and_a_missing_path_is_refused(tmp_path):
    out = tmp_path / "fresh"
    result = run(MIXER, *SMOKE, *TINY[MIXER], "--epochs", "1", "--limit-batches", "1", "--out", out,
                 "--resume", "auto", cwd=tmp_path)
    assert_ok(result)
    assert "starting a new run" in result.stdout
    missing = run(MIXER, *SMOKE, "--resume", tmp_path / "nope.npz", cwd=tmp_path)
    assert_clean_failure(missing)
    assert "nope.npz" in missing.stderr


@pytest.mark.parametrize("how", [["--download-url", "http://127.0.0.1:9/cifar-10-binary.tar.gz"],
                                 ["--no-download"]])
def test_cifar_offline_without_data_explains_what_to_do(tmp_path, how):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run(MIXER, "--dataset", "cifar10", "--data-dir", empty, "--no-progress", *how, cwd=tmp_path)
    assert_clean_failure(result)
    assert "--data-dir" in result.stderr and "--dataset synthetic" in result.stderr
    assert str(empty) in result.stderr
    assert list(empty.iterdir()) == []                    # nothing half-written
    assert not (tmp_path / "runs").exists()               # failed before creating outputs


@pytest.mark.skipif(tinymlp.cuda_available(), reason="a GPU is usable here")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    result = run(GMLP, *SMOKE, "--device", "cuda", cwd=tmp_path)
    assert_clean_failure(result)
    assert "cuda" in result.stderr.lower() and "doctor" in result.stderr


def test_help_says_what_the_warmup_counts(tmp_path):
    for script in (MIXER, GMLP):
        result = run(script, "--help", cwd=tmp_path)
        assert_ok(result)
        assert "EPOCHS" in result.stdout and "--resume" in result.stdout and "--limit-batches" in result.stdout
    assert "--attn-dim" in result.stdout and "--toeplitz" in result.stdout


@pytest.mark.parametrize("flags,words", [
    (["--lr", "nan"], "--lr nan: expected a finite number"),
    (["--weight-decay", "inf"], "--weight-decay inf: expected a finite number"),
    (["--lr", "0"], "--lr 0: expected a value greater than 0"),
    (["--label-smoothing", "1"], "--label-smoothing 1: expected a value in [0, 1)"),
    (["--mixup", "-0.5"], "--mixup -0.5: expected a value at least 0"),
    (["--cutmix", "nan"], "--cutmix nan"),
    (["--warmup", "-1"], "--warmup -1: expected a value at least 0"),
    (["--warmup", "9", "--epochs", "3"], "--warmup 9 epochs is longer than the run (--epochs 3)"),
    (["--depth", "0"], "--depth 0: expected a value at least 1"),
    (["--dim", "-4"], "--dim -4: expected a value at least 1"),
    (["--dropout", "1.5"], "--dropout 1.5: expected a value in [0, 1)"),
    (["--out", "FILE/sub"], "not writable (cannot create it inside"),
])
def test_every_flag_is_checked_before_any_download_or_model(tmp_path, flags, words):
    (tmp_path / "FILE").write_text("a file, not a folder")
    flags = [str(tmp_path / f) if f.startswith("FILE") else f for f in flags]
    # CIFAR from a port where nothing listens: a flag checked too late would fail on the download instead
    result = run(MIXER, "--download-url", "http://127.0.0.1:9/cifar-10-binary.tar.gz", "--no-progress", *flags,
                 cwd=tmp_path)
    assert_clean_failure(result)
    assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_damaged_resume_file_or_changed_architecture_is_a_one_line_error(tmp_path):
    out = tmp_path / "run"
    assert_ok(run(GMLP, *SMOKE, *TINY[GMLP], "--attn-dim", "8", "--epochs", "1", "--out", out, cwd=tmp_path))
    saved = (out / "checkpoint.npz").read_bytes()
    for name, content in [("truncated.npz", saved[: len(saved) // 2]), ("empty.npz", b""),
                          ("random.npz", os.urandom(300))]:
        (tmp_path / name).write_bytes(content)
        result = run(GMLP, *SMOKE, "--epochs", "2", "--resume", tmp_path / name, cwd=tmp_path)
        assert_clean_failure(result)
        assert str(tmp_path / name) in result.stderr and result.stderr.count("\n") == 1, result.stderr
        assert "pickle" not in result.stderr
    changed = run(GMLP, *SMOKE, "--epochs", "2", "--resume", "auto", "--out", out, "--depth", "3",
                  "--attn-dim", "0", "--dim", "16", cwd=tmp_path)
    assert_clean_failure(changed)
    assert "--depth 3 (checkpoint: 2)" in changed.stderr and "--attn-dim 0 (checkpoint: 8)" in changed.stderr
    assert "--dim" not in changed.stderr                       # the same as the checkpoint's: no difference
    assert "keeps the checkpoint's architecture" in changed.stderr


def test_help_shows_each_default_once(tmp_path):
    for script in (MIXER, GMLP):
        result = run(script, "--help", cwd=tmp_path)
        assert_ok(result)
        text = " ".join(result.stdout.split())
        assert "(default: None)" not in text and "(default: False)" not in text
        for flag in text.split(" --")[1:]:
            assert flag.count("default") + flag.count("preset") <= 1, flag
        assert "images per training step (default: 128)" in text and "in [0, 1) (default: 0.0)" in text
