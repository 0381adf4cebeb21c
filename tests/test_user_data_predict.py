"""Predict checks what it is given (tinymlp.predict, ``python -m tinymlp predict``): the rank and
channel layout of an array, a checkpoint's class names against its head, its preprocessing (finite,
positive), 16-bit images scaled (in training too), sentence pairs only for a pair model, any file
name (non-ASCII, non-UTF-8) in the output and the errors, a closed pipe, and a checkpoint whose
model would not fit refused before it is built. The checkpoints are written here, small, in the
form the example scripts write them."""

import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pytest

from tinymlp import checkpoint, models
from tinymlp.checkpoint import CheckpointError
from tinymlp.data import Tokenizer
from tinymlp.data.folder import ImageFolder, read_image
from tinymlp.predict import PredictError, load
from test_own_data import ROOT, needs_pillow, write_png

PREPROCESS = {"kind": "image", "size": 8, "image_size": 32, "mean": [0.5] * 3, "std": [0.25] * 3}


def image_checkpoint(path, classes=("cat", "dog"), preprocess=PREPROCESS, **config):
    config = {"num_classes": 2, "dim": 8, "depth": 1, "token_mlp_dim": 8, "channel_mlp_dim": 8, **config}
    model = models.create("mixer_cifar", **config)
    checkpoint.save(path, model, preset="mixer_cifar", model_config=model.config, classes=list(classes),
                    preprocess=preprocess)
    return path


def text_checkpoint(path, paired):
    tok = Tokenizer.train(["a fine film", "a dull film", "the plot was thin"] * 4, vocab_size=40)
    model = models.create("gmlp_text_split", num_classes=2, dim=8, depth=1, ffn_dim=16, seq_len=12,
                          vocab_size=len(tok))
    checkpoint.save(path, model, preset="gmlp_text_split", model_config=model.config, classes=["neg", "pos"],
                    tokenizer=tok.to_dict(), preprocess={"kind": "text", "seq_len": 12, "paired": paired})
    return path


def cli(*args, cwd, env=None, **kwargs):
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "tinymlp", "predict", *args], cwd=cwd, env=environment,
                          capture_output=True, timeout=300, check=False, **kwargs)


# ---------------------------------------------------------------------- arrays
@pytest.mark.parametrize("shape", [(8, 8, 3), (3, 8, 8), (8, 8, 1)])
def test_one_image_without_its_batch_axis_is_refused(tmp_path, shape):
    predictor = load(image_checkpoint(tmp_path / "c.npz"))
    with pytest.raises(PredictError, match=rf"the images given has shape \({shape[0]}, {shape[1]}, {shape[2]}\): "
                                           r"one image without its batch axis\?"):
        predictor.predict(np.zeros(shape, np.uint8))
    assert len(predictor.predict(np.zeros((1, *shape), np.uint8))) == 1
    assert len(predictor.predict(np.zeros((5, 8, 8), np.uint8))) == 5        # five grey images
    assert len(predictor.predict(np.zeros((1, 8, 8), np.uint8))) == 1


def test_an_array_whose_channel_axis_is_ambiguous_is_refused(tmp_path):
    predictor = load(image_checkpoint(tmp_path / "c.npz"))
    with pytest.raises(PredictError, match=r"\(2, 3, 8, 3\).*channels first or last"):
        predictor.predict(np.zeros((2, 3, 8, 3), np.uint8))


# ---------------------------------------------------------------------- what a checkpoint says
def test_class_names_that_do_not_match_the_head_are_refused(tmp_path):
    path = image_checkpoint(tmp_path / "c.npz", classes=("cat", "dog", "owl"))
    with pytest.raises(CheckpointError, match=r"c.npz names 3 classes \(cat, dog, owl\) but its model has 2 outputs"):
        load(path)


@pytest.mark.parametrize("change,words", [
    ({"mean": [float("nan"), 0.5, 0.5]}, "its preprocessing's mean holds nan"),
    ({"std": [0.25, 0.0, 0.25]}, "its preprocessing's std holds 0"),
    ({"std": [0.25, 0.25]}, "its preprocessing's std has 2 values"),
    ({"size": 0}, "its preprocessing's size is 0"),
    ({"size": "8"}, "its preprocessing's size is '8'"),
])
def test_preprocessing_that_cannot_be_right_is_refused(tmp_path, change, words):
    path = image_checkpoint(tmp_path / "c.npz", preprocess={**PREPROCESS, **change})
    with pytest.raises(CheckpointError, match=rf"c.npz: {words}"):
        load(path)


def test_a_model_too_big_for_its_file_or_the_memory_is_refused_before_it_is_built(tmp_path, monkeypatch):
    path = image_checkpoint(tmp_path / "c.npz")
    meta = checkpoint.read_meta(path)
    model = models.create("mixer_cifar", **meta["model_config"])
    huge = {**meta["model_config"], "dim": 200_000, "depth": 500, "channel_mlp_dim": 800_000}
    checkpoint.save(path, model, **{**meta, "model_config": huge})
    with pytest.raises(CheckpointError, match=r"its model_config describes a model of [\d,]+ parameters, but the file "
                                              r"holds 1,698"):
        load(path)

    import tinymlp.predict

    image_checkpoint(path)
    monkeypatch.setattr(tinymlp.predict, "memory_limit", lambda device: (10_000, "of memory on this cpu"))
    with pytest.raises(CheckpointError, match=r"c.npz: its model \(1,698 parameters\) needs about .* to load, more "
                                              r"than the .* of memory on this cpu"):
        load(path)


# ---------------------------------------------------------------------- 16-bit images
def write_png16(path, pixels):
    """A 16-bit grey PNG (Pillow reads it as mode I;16)."""
    import struct
    import zlib

    h, w = pixels.shape
    raw = b"".join(b"\x00" + pixels[r].astype(">u2").tobytes() for r in range(h))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


@needs_pillow
def test_16_bit_images_are_scaled_in_training_and_in_predict(tmp_path):
    write_png16(tmp_path / "train" / "dark" / "a.png", np.full((4, 4), 8224, np.uint16))      # 8224 / 257 = 32
    write_png16(tmp_path / "train" / "light" / "a.png", np.full((4, 4), 49344, np.uint16))    # 192
    assert read_image(tmp_path / "train" / "dark" / "a.png", 4).max() == 32
    train = ImageFolder(tmp_path, "train", size=4)
    assert sorted(int(v) for v in train.images[:, 0, 0, 0]) == [32, 192]


# ---------------------------------------------------------------------- texts and pairs
@pytest.mark.slow
def test_a_tab_is_a_pair_only_for_a_pair_model(tmp_path):
    single, pair = load(text_checkpoint(tmp_path / "s.npz", False)), load(text_checkpoint(tmp_path / "p.npz", True))
    with pytest.raises(PredictError, match=r"s.npz is a model of single texts: \('a fine film', 'a plot'\) is a pair"):
        single.predict([("a fine film", "a plot")])
    with pytest.raises(PredictError, match=r"p.npz is a model of sentence pairs: 'a fine film' is one text"):
        pair.predict(["a fine film"])
    assert len(pair.predict([("a fine film", "a plot")])) == 1

    lines = tmp_path / "lines.txt"
    lines.write_text("a fine film\tthe plot\nthe plot was thin\n")
    result = cli(tmp_path / "s.npz", lines, "--json", cwd=tmp_path, text=True)
    assert result.returncode == 0, result.stderr
    assert [r["input"] for r in json.loads(result.stdout)] == ["a fine film\tthe plot", "the plot was thin"]
    result = cli(tmp_path / "p.npz", lines, cwd=tmp_path, text=True)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (f"{lines}, line 2: a sentence-pair model needs a text and its pair, separated by a tab"
            in result.stderr)


# ---------------------------------------------------------------------- file names and pipes
@pytest.mark.slow
@needs_pillow
@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_any_file_name_is_shown_and_the_json_stays_valid(tmp_path, encoding):
    image_checkpoint(tmp_path / "c.npz")
    folder = os.fsencode(tmp_path / "in")
    os.makedirs(folder)
    names = [unicodedata.normalize("NFC", "café.png").encode(), b"caf\xe9.png"]     # UTF-8, and Latin-1 bytes
    for name in names:
        write_png(tmp_path / "scratch.png", np.zeros((8, 8, 3)))
        os.rename(tmp_path / "scratch.png", os.path.join(folder, name))
    env = {"PYTHONIOENCODING": encoding}
    result = cli(tmp_path / "c.npz", tmp_path / "in", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr
    shown = sorted(r["input"] for r in json.loads(result.stdout.decode(encoding)))
    assert shown == sorted([str(tmp_path / "in" / "café.png"), str(tmp_path / "in") + "/caf\\xe9.png"])
    plain = cli(tmp_path / "c.npz", tmp_path / "in", cwd=tmp_path, env=env)
    assert plain.returncode == 0 and b"Traceback" not in plain.stderr and len(plain.stdout.splitlines()) == 2
    assert b"caf\\xe9.png: " in plain.stdout

    (tmp_path / "in" / "broken.png").write_bytes(b"not a png")
    os.rename(tmp_path / "in" / "broken.png", os.path.join(folder, b"br\xffoken.png"))
    bad = cli(tmp_path / "c.npz", tmp_path / "in", cwd=tmp_path, env=env)
    assert bad.returncode == 2 and b"Traceback" not in bad.stderr and b"br\\xffoken.png: cannot be read" in bad.stderr


def test_a_closed_pipe_ends_quietly(tmp_path):
    text_checkpoint(tmp_path / "s.npz", False)
    lines = tmp_path / "lines.txt"
    lines.write_text("a fine film and a thin plot\n" * 4000)       # more than a pipe holds
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(f"{sys.executable} -m tinymlp predict s.npz lines.txt | head -1", shell=True,
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.stdout.startswith("a fine film and a thin plot: ")
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
