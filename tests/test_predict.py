"""A user's whole loop on their own data: train with a validation set held out of training (the
best epoch kept as best.npz, the test set reported once, at the end), resume with nothing
restated, and classify new images or texts with ``python -m tinymlp predict`` or
``tinymlp.predict``, in agreement with the run's own evaluation of its test set."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from tinymlp import predict
from tinymlp.checkpoint import read_meta
from tinymlp.data.folder import ImageFolder
from test_own_data import (
    ROOT, TINY_IMAGE, TINY_TEXT, image_folder, needs_pillow, ok, refused, reviews_csv, run, write_png,
)

pytestmark = pytest.mark.slow   # trains runs with the example scripts: not in the everyday suite


def tinymlp_cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tinymlp", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def metrics(out):
    return json.loads((out / "metrics.json").read_text())


# ---------------------------------------------------------------------- images: train, validate, predict
@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """Two epochs of a Mixer on a folder of two classes, with a validation set held out."""
    tmp = tmp_path_factory.mktemp("images")
    root = image_folder(tmp / "pets", per_class=(10, 4))
    out = tmp / "run"
    stdout = ok(run("train_cifar_mixer.py", "--dataset", "folder", "--data-dir", root, *TINY_IMAGE, "--epochs", "2",
                    "--val-fraction", "0.2", "--lr", "0.01", "--out", out, cwd=tmp))
    return root, out, stdout


@needs_pillow
def test_validation_is_held_out_of_training_and_the_test_set_is_reported_once(image_run):
    root, out, stdout = image_run
    assert "folder: 16 train / 4 validation / 8 test images" in stdout
    assert stdout.count("validation loss") == 2 and stdout.count("test accuracy") == 1     # per epoch; at the end
    m = metrics(out)
    assert m["splits"]["validation"].startswith("0.2 of each class of the training images") and "4 examples" in \
        m["splits"]["validation"] and m["splits"]["test"].startswith(f"{root / 'test'}/: 8 examples")
    history = m["history"]
    best = 1 + max(range(2), key=lambda i: (history["val_acc"][i], -history["val_loss"][i], -i))
    assert m["best_epoch"] == best and (out / "best.npz").is_file()
    assert read_meta(out / "best.npz")["epoch"] == best and read_meta(out / "checkpoint.npz")["epoch"] == 2
    assert m["test"]["last"]["epoch"] == 2 and m["test"]["used"] == f"best.npz, epoch {best}"
    assert f"(best.npz, epoch {best}" in stdout


@needs_pillow
def test_predict_agrees_with_the_runs_own_evaluation_of_its_test_set(image_run):
    root, out, _ = image_run
    result = tinymlp_cli("predict", out, root / "test", "--json", "--top", "2", cwd=out.parent)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    files = sorted((root / "test").rglob("*.png"))
    assert [r["input"] for r in rows] == [str(f) for f in files]               # one per input, in input order
    truth = [f.parent.name for f in files]
    accuracy = np.mean([r["class"] == t for r, t in zip(rows, truth)])
    loss = -np.mean([math.log({p["class"]: p["probability"] for p in r["top"]}[t]) for r, t in zip(rows, truth)])
    tested = metrics(out)["test"]["best"]
    assert accuracy == pytest.approx(tested["accuracy"]) and loss == pytest.approx(tested["loss"], rel=1e-4)
    assert all(len(r["top"]) == 2 and r["top"][0]["probability"] >= r["top"][1]["probability"] for r in rows)
    assert "best.npz" in result.stderr                                          # which checkpoint was used

    plain = tinymlp_cli("predict", out / "checkpoint.npz", files[0], files[-1], cwd=out.parent)
    assert plain.returncode == 0 and len(plain.stdout.strip().splitlines()) == 2
    assert plain.stdout.startswith(f"{files[0]}: ") and plain.stdout.rstrip().endswith("%")


@needs_pillow
def test_the_python_function_predicts_arrays_as_the_command_predicts_files(image_run):
    root, out, _ = image_run
    predictor = predict.load(out)
    files = sorted((root / "test").rglob("*.png"))
    from_files = predictor.probabilities(files)
    images = ImageFolder(root, "test", size=32).images          # the files as the run read them (N, 3, 32, 32)
    assert np.allclose(predictor.probabilities(images), from_files, atol=1e-6)
    assert np.allclose(predictor.probabilities(images.transpose(0, 2, 3, 1)), from_files, atol=1e-6)   # NHWC
    assert np.allclose(predictor.probabilities(images / 255.0), from_files, atol=1e-6)                 # floats
    results = predict.predict(out, images, top=1)
    assert [r["class"] for r in results] == [predictor.classes[k] for k in from_files.argmax(axis=1)]
    meta = read_meta(out / "best.npz")["preprocess"]
    assert meta["kind"] == "image" and meta["size"] == 32 and len(meta["mean"]) == 3 and len(meta["std"]) == 3


@needs_pillow
def test_predict_errors_are_one_line(image_run, tmp_path):
    root, out, _ = image_run
    for args, words in ((["--text", "a cat"], "is an image model"), ([], "nothing to classify"),
                        ([tmp_path / "missing.png"], "missing.png: no such file or folder"),
                        ([tmp_path], "a folder without image files"), (["--top", "0", root], "--top 0")):
        result = tinymlp_cli("predict", out, *args, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith("error: ") and words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    result = tinymlp_cli("predict", tmp_path, root, cwd=tmp_path)
    assert result.returncode == 2 and "a folder without best.npz or checkpoint.npz" in result.stderr


@needs_pillow
def test_a_resumed_run_restates_nothing_and_refuses_another_data_dir(image_run, tmp_path):
    root, out, _ = image_run
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("checkpoint.npz", "best.npz"):
        (copy / name).write_bytes((out / name).read_bytes())
    stdout = ok(run("train_cifar_mixer.py", "--epochs", "3", "--no-progress", "--resume", "auto", "--out", copy,
                    cwd=tmp_path))
    assert "folder: 16 train / 4 validation / 8 test images" in stdout and "epoch 3/3" in stdout
    other = image_folder(tmp_path / "other", per_class=(10, 4))
    refused(run("train_cifar_mixer.py", "--data-dir", other, "--epochs", "4", "--no-progress", "--resume", "auto",
                "--out", copy, cwd=tmp_path), f"trained with --data-dir {root}", "keeps its data")
    ok(run("train_cifar_mixer.py", "--dataset", "folder", "--data-dir", root, "--batch-size", "4", "--epochs", "4",
           "--no-progress", "--resume", "auto", "--out", copy, cwd=tmp_path))            # restated, the same


@needs_pillow
def test_torchvision_layout_and_a_val_folder_from_the_command_line(tmp_path):
    root = tmp_path / "flat"
    for name, colour in (("cat", 30), ("dog", 220)):
        for i in range(10):
            write_png(root / name / f"{i}.png", np.full((6, 6, 3), colour + i))
    stdout = ok(run("train_cifar_mixer.py", "--dataset", "folder", "--data-dir", root, *TINY_IMAGE,
                    "--val-fraction", "0", "--out", tmp_path / "flat_run", cwd=tmp_path))
    assert "one folder per class (torchvision's layout): 2 of its 20 images" in stdout
    assert "folder: 18 train / 2 test images" in stdout and not (tmp_path / "flat_run" / "best.npz").exists()
    assert metrics(tmp_path / "flat_run")["validation"].startswith("none (--val-fraction 0)")

    split = image_folder(tmp_path / "split", per_class=(6, 2))
    for name in ("cat", "dog"):
        write_png(split / "val" / name / "0.png", np.zeros((6, 6, 3)))
    stdout = ok(run("train_cifar_mixer.py", "--dataset", "folder", "--data-dir", split, *TINY_IMAGE,
                    "--out", tmp_path / "split_run", cwd=tmp_path))
    assert "folder: 12 train / 2 validation / 4 test images" in stdout


# ---------------------------------------------------------------------- text
def test_text_predict_agrees_with_the_runs_evaluation_and_reads_lines(tmp_path):
    path = reviews_csv(tmp_path / "reviews.csv")
    test = tmp_path / "test.csv"
    test.write_text('id,review,sentiment\n1,"a fine film, good",pos\n2,"a dull film, bad",neg\n3,"good",pos\n',
                    encoding="utf-8")
    out = tmp_path / "run"
    stdout = ok(run("train_text_gmlp.py", "--dataset", "csv", "--train-file", path, "--test-file", test,
                    "--text-column", "review", "--label-column", "sentiment", *TINY_TEXT, "--epochs", "2",
                    "--out", out, cwd=tmp_path))
    assert "csv: 54 train / 6 validation / 3 test sentences" in stdout
    texts, truth = ["a fine film, good", "a dull film, bad", "good"], ["pos", "neg", "pos"]
    results = predict.predict(out, texts, top=2)
    accuracy = np.mean([r["class"] == t for r, t in zip(results, truth)])
    loss = -np.mean([math.log({p["class"]: p["probability"] for p in r["top"]}[t]) for r, t in zip(results, truth)])
    tested = metrics(out)["test"]["best"]
    assert accuracy == pytest.approx(tested["accuracy"]) and loss == pytest.approx(tested["loss"], rel=1e-4)

    lines = tmp_path / "new.txt"
    lines.write_text("a fine film\n\nthe worst\n", encoding="utf-8")
    result = tinymlp_cli("predict", out, "--text", "so good", lines, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["input"] for r in rows] == ["so good", "a fine film", "the worst"]
    assert rows[1]["file"] == str(lines) and rows[2]["line"] == 3 and {r["class"] for r in rows} <= {"neg", "pos"}


def test_predict_refuses_a_masked_lm_and_a_changed_pretrained_is_refused_on_resume(tmp_path):
    path = reviews_csv(tmp_path / "reviews.csv")
    flags = ["--dataset", "csv", "--train-file", path, "--text-column", "review", *TINY_TEXT]
    ok(run("pretrain_mlm.py", *flags, "--out", tmp_path / "mlm", cwd=tmp_path))
    ok(run("pretrain_mlm.py", *flags, "--seed", "1", "--out", tmp_path / "mlm2", cwd=tmp_path))
    result = tinymlp_cli("predict", tmp_path / "mlm", "--text", "a film", cwd=tmp_path)
    assert result.returncode == 2 and "a masked language model" in result.stderr and "--pretrained" in result.stderr

    out = tmp_path / "cls"
    ok(run("train_text_gmlp.py", *flags, "--label-column", "sentiment", "--pretrained", tmp_path / "mlm" /
           "checkpoint.npz", "--out", out, cwd=tmp_path))
    refused(run("train_text_gmlp.py", "--pretrained", tmp_path / "mlm2" / "checkpoint.npz", "--epochs", "2",
                "--no-progress", "--resume", "auto", "--out", out, cwd=tmp_path),
            "trained with --pretrained", "a resumed run keeps it")
    ok(run("train_text_gmlp.py", "--epochs", "2", "--no-progress", "--resume", "auto", "--out", out, cwd=tmp_path))
