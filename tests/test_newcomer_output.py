"""What a newcomer reads in the plots and the example scripts' output (issue 15, item 7)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinymlp import plot
from tinymlp.train import History, format_epoch

ROOT = Path(__file__).resolve().parent.parent


def test_token_mixing_plot_has_a_colour_bar_and_a_caption(tmp_path):
    w = np.random.default_rng(0).normal(size=(16, 6))
    fig = plot.token_mixing_weights(w, tmp_path / "tm.png")
    assert (tmp_path / "tm.png").stat().st_size > 0
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1
    assert "max |weight|" in bars[0].get_ylabel()
    lo, hi = bars[0].get_ylim()
    assert (lo, hi) == (-1.0, 1.0)
    caption = fig._supxlabel.get_text()
    assert caption == plot.TOKEN_MIXING_CAPTION
    assert "Red" in caption and "blue" in caption and "white" in caption


def test_held_out_split_named_by_the_caller(tmp_path):
    h = History()
    h.append(epoch=1, train_loss=1.0, train_acc=0.5, val_loss=0.9, val_acc=0.6, lr=1e-3,
             epoch_time=1.0, images_per_sec=10.0, steps=3)
    assert "| val loss 0.9000" in format_epoch(h, 1)
    assert "| test loss 0.9000" in format_epoch(h, 1, "test")
    fig = plot.training_curves(h, tmp_path / "c.png", val_name="test")
    labels = {line.get_label() for ax in fig.axes for line in ax.get_lines()}
    assert labels == {"train", "test"}


@pytest.mark.slow
def test_cli_says_test_names_the_widths_and_counts_epochs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg",
           "TINYMLP_DATA": str(tmp_path / "no-data-here")}
    args = ["--dataset", "synthetic", "--synthetic-size", "64", "--batch-size", "16", "--limit-batches", "1",
            "--no-progress", "--epochs", "1", "--dim", "16", "--depth", "2", "--token-mlp-dim", "8",
            "--channel-mlp-dim", "32"]
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "train_cifar_mixer.py"), *args],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    header = out.splitlines()[0]
    assert header.startswith("MLPMixer (mixer_cifar with dim 16, depth 2, token_mlp_dim 8, channel_mlp_dim 32): ")
    assert "| 1 epoch x 1 steps" in header
    assert "| validation loss" in out and "done: test accuracy" in out and out.count("test accuracy") == 1
    assert " val " not in out and "val loss" not in out and "| test loss" not in out     # per epoch: validation
    assert "1 epochs" not in out and "| 1 epoch |" in out
