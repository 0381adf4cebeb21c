"""examples/finetune.py end to end (CPU, offline, seconds): from a converted checkpoint to a
fine-tuned run on the synthetic set, and on from its checkpoint with --resume.

The pretrained files are tiny models written by the test in timm's layout (``to_timm``, saved
as a plain .npz without tinymlp's header, as a converted timm checkpoint would be) and in the
official Flax layout.
"""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinymlp import interop, models
from tinymlp.checkpoint import read_meta

pytestmark = pytest.mark.slow   # fine-tunes with the example script: not in the everyday suite

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "finetune.py"
SMOKE = ["--dataset", "synthetic", "--synthetic-size", "160", "--batch-size", "16", "--limit-batches", "2",
         "--no-progress"]


def run(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TINYMLP_DATA": str(cwd / "no-data")}
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def ok(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def refused(result, *words):
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr
    return result


def pretrained(tmp_path, model, name):
    """A checkpoint in timm's layout, as a converted timm file holds it (names and arrays only)."""
    rng = np.random.default_rng(1)
    for _, p in model.named_parameters():
        p.data[...] += (0.05 * rng.standard_normal(p.shape)).astype(p.dtype)
    path = tmp_path / name
    np.savez(path, **interop.to_timm(model))
    return path


def test_finetune_mixer_from_timm_weights_then_resume(tmp_path):
    # pre-trained at 16 x 16 with 8 x 8 patches and 7 classes: the CIFAR-size images are resized
    # to 16 x 16 and the head is replaced by a zero one for the synthetic set's 10 classes
    mixer = models.MLPMixer(image_size=16, patch_size=8, in_channels=3, num_classes=7, dim=16, depth=2,
                            token_mlp_dim=8, channel_mlp_dim=32, gelu="exact")
    weights = pretrained(tmp_path, mixer, "mixer_tiny.npz")
    out = tmp_path / "run"
    first = ok(run(*SMOKE, "--pretrained", weights, "--epochs", "1", "--out", out, cwd=tmp_path))
    assert "new zero head for 10 classes" in first.stdout and "SGD" in first.stdout
    meta = read_meta(out / "checkpoint.npz")
    assert meta["model_class"] == "MLPMixer" and meta["model_config"]["num_classes"] == 10
    assert meta["model_config"]["gelu"] == "exact" and meta["args"]["image_size"] == 16
    assert (meta["args"]["optimizer"], meta["args"]["schedule"], meta["args"]["normalize"]) == \
        ("sgd", "cosine", "inception")
    for name in ("metrics.json", "curves.png", "weights.png"):
        assert (out / name).stat().st_size > 0

    # resume: no --pretrained needed, the checkpoint holds the architecture and the pipeline
    second = ok(run(*SMOKE, "--epochs", "2", "--resume", out / "checkpoint.npz", cwd=tmp_path))
    assert "resuming" in second.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["history"]["epoch"] == [1, 2] and metrics["model"] == "MLPMixer"
    assert read_meta(out / "checkpoint.npz")["epoch"] == 2

    # a resumed run keeps its pipeline; Mixer keeps its pretraining resolution
    refused(run(*SMOKE, "--epochs", "3", "--resume", out / "checkpoint.npz", "--optimizer", "adamw", cwd=tmp_path),
            "--optimizer sgd")
    refused(run(*SMOKE, "--pretrained", weights, "--image-size", "32", "--out", tmp_path / "r2", cwd=tmp_path),
            "pre-trained at 16", "--image-size 16")


def test_finetune_vit_at_a_new_resolution_interpolates_its_position_embedding(tmp_path):
    vit = models.ViT(image_size=16, patch_size=8, in_channels=3, num_classes=10, dim=16, depth=1, heads=2,
                     mlp_dim=32, gelu="exact")
    weights = pretrained(tmp_path, vit, "vit_tiny.npz")
    refused(run(*SMOKE, "--pretrained", weights, cwd=tmp_path), "--heads N")
    out = tmp_path / "vit"
    result = ok(run(*SMOKE, "--pretrained", weights, "--heads", "2", "--image-size", "32", "--epochs", "1",
                    "--out", out, cwd=tmp_path))
    assert "its own head for 10 classes" in result.stdout       # the same class count: the head stays
    meta = read_meta(out / "checkpoint.npz")
    assert meta["model_config"]["image_size"] == 32 and meta["model_config"]["heads"] == 2
    ok(run(*SMOKE, "--epochs", "2", "--resume", "auto", "--out", out, cwd=tmp_path))
    assert read_meta(out / "checkpoint.npz")["epoch"] == 2


def test_finetune_from_an_official_jax_checkpoint(tmp_path):
    mixer = models.MLPMixer(image_size=32, patch_size=8, in_channels=3, num_classes=4, dim=16, depth=1,
                            token_mlp_dim=8, channel_mlp_dim=32)
    state = mixer.state_dict()
    flax = {"stem/kernel": state["patch_embed.proj.weight"].reshape(3, 8, 8, 16).transpose(1, 2, 0, 3),
            "stem/bias": state["patch_embed.proj.bias"],
            "pre_head_layer_norm/scale": state["norm.weight"], "pre_head_layer_norm/bias": state["norm.bias"],
            "head/kernel": state["head.weight"], "head/bias": state["head.bias"]}
    for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_1")):
        flax[f"MixerBlock_0/{theirs}/scale"] = state[f"blocks.0.{ours}.weight"]
        flax[f"MixerBlock_0/{theirs}/bias"] = state[f"blocks.0.{ours}.bias"]
    for ours, theirs in (("token_mlp", "token_mixing"), ("channel_mlp", "channel_mixing")):
        for k in (0, 1):
            flax[f"MixerBlock_0/{theirs}/Dense_{k}/kernel"] = state[f"blocks.0.{ours}.fc{k + 1}.weight"]
            flax[f"MixerBlock_0/{theirs}/Dense_{k}/bias"] = state[f"blocks.0.{ours}.fc{k + 1}.bias"]
    path = tmp_path / "Mixer-tiny.npz"
    np.savez(path, **flax)
    out = tmp_path / "jax"
    result = ok(run(*SMOKE, "--pretrained", path, "--epochs", "1", "--out", out, cwd=tmp_path))
    assert "MLPMixer" in result.stdout and "normalize inception" in result.stdout
    assert read_meta(out / "checkpoint.npz")["model_config"]["gelu"] == "tanh"


def test_finetune_refuses_pickles_and_says_what_it_needs(tmp_path):
    pth = tmp_path / "model.pth"
    pth.write_bytes(pickle.dumps({"weights": None}))
    refused(run(*SMOKE, "--pretrained", pth, cwd=tmp_path), "never unpickles", "save_file")
    refused(run(*SMOKE, cwd=tmp_path), "--pretrained PATH is needed")
    help_text = ok(run("--help", cwd=tmp_path)).stdout
    assert "pretraining resolution" in help_text and "sgd" in help_text
    assert all(flag in help_text for flag in ("--pretrained", "--heads", "--image-size", "--normalize"))

