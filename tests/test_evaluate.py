"""``python -m tinymlp evaluate``: a trained run scored on its own test set (top-1 being the test
accuracy the run reported) or on other labelled data: top-1, top-5, the loss, per-class precision,
recall and accuracy as JSON, and the confusion matrix as a picture."""

import json

import numpy as np
import pytest

from tinymlp.evaluate import EvaluateError, scores
from test_own_data import TINY_IMAGE, TINY_TEXT, image_folder, needs_pillow, ok, refused, reviews_csv, run
from test_predict import metrics, tinymlp_cli


# ---------------------------------------------------------------------- the numbers, against counting by hand
def test_scores_count_as_a_hand_count_does():
    classes = ["a", "b", "c", "d", "e", "f"]
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(6), size=40)
    labels = rng.integers(0, 6, size=40)
    labels[labels == 5] = 4                                 # class f never occurs: its recall is None
    got = scores(p, labels, classes)
    guess = p.argmax(axis=1)
    assert got["examples"] == 40 and got["top1"] == pytest.approx(np.mean(guess == labels))
    top5 = [labels[n] in np.argsort(-p[n])[:5] for n in range(40)]
    assert got["top5"] == pytest.approx(np.mean(top5))
    assert got["loss"] == pytest.approx(-np.mean([np.log(p[n, labels[n]]) for n in range(40)]))
    for c, name in enumerate(classes):
        row = got["per_class"][name]
        of_c = [n for n in range(40) if labels[n] == c]
        said_c = [n for n in range(40) if guess[n] == c]
        right = sum(guess[n] == c for n in of_c)
        assert row["support"] == len(of_c)
        assert row["recall"] == (pytest.approx(right / len(of_c)) if of_c else None)
        assert row["accuracy"] == row["recall"]
        assert row["precision"] == (pytest.approx(sum(labels[n] == c for n in said_c) / len(said_c))
                                    if said_c else None)
        assert got["confusion"][c] == [sum(1 for n in of_c if guess[n] == j) for j in range(6)]
    assert got["per_class"]["f"]["recall"] is None and got["per_class"]["f"]["support"] == 0


def test_scores_top5_is_none_with_five_classes_or_fewer_and_bad_input_is_one_sentence():
    p = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]])
    assert scores(p, [0, 1], "xyz")["top5"] is None
    with pytest.raises(EvaluateError, match="labels must lie in 0..2"):
        scores(p, [0, 3], "xyz")
    with pytest.raises(EvaluateError, match=r"shape \(2, 3\) for 3 labels"):
        scores(p, [0, 1, 2], "xyz")


# ---------------------------------------------------------------------- a run's own test set
def evaluated(out, *args, cwd):
    result = tinymlp_cli("evaluate", out, "--json", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """A Mixer on a folder without test/ (the test set held out of train/), with a validation set."""
    tmp = tmp_path_factory.mktemp("evaluate")
    root = image_folder(tmp / "pets", classes=("cat", "dog", "owl"), per_class=(10, 3))
    import shutil
    shutil.rmtree(root / "test")
    out = tmp / "run"
    ok(run("train_cifar_mixer.py", "--dataset", "folder", "--data-dir", root, *TINY_IMAGE, "--epochs", "2",
           "--val-fraction", "0.2", "--lr", "0.01", "--out", out, cwd=tmp))
    return tmp, root, out


@pytest.mark.slow
@needs_pillow
def test_evaluate_scores_the_runs_own_held_out_test_set_as_the_run_did(folder_run):
    tmp, root, out = folder_run
    result = evaluated(out, cwd=tmp)
    tested = metrics(out)["test"]
    chosen = tested.get("best", tested["last"])
    assert result["checkpoint"].endswith(chosen["checkpoint"]) and result["epoch"] == chosen["epoch"]
    assert result["examples"] == 3 and result["top1"] == pytest.approx(chosen["accuracy"])
    assert result["loss"] == pytest.approx(chosen["loss"], rel=1e-4)
    assert result["classes"] == ["cat", "dog", "owl"] and result["top5"] is None
    assert set(result["per_class"]) == {"cat", "dog", "owl"}
    assert all(set(row) == {"precision", "recall", "accuracy", "support"} for row in result["per_class"].values())
    assert np.sum(result["confusion"]) == 3
    assert json.loads((out / "evaluation.json").read_text())["top1"] == result["top1"]
    assert (out / "evaluation_confusion.png").stat().st_size > 0


@pytest.mark.slow
@needs_pillow
def test_evaluate_other_labelled_data_and_prints_a_table(folder_run):
    tmp, root, out = folder_run
    only_cats = tmp / "cats"
    (only_cats / "cat").mkdir(parents=True)
    for f in sorted((root / "train" / "cat").glob("*.png"))[:4]:
        (only_cats / "cat" / f.name).write_bytes(f.read_bytes())
    result = evaluated(out, "--data", only_cats, "--out", tmp / "cats_eval", cwd=tmp)
    assert result["examples"] == 4 and result["per_class"]["cat"]["support"] == 4
    assert result["per_class"]["dog"]["support"] == 0 and result["per_class"]["dog"]["recall"] is None
    assert (tmp / "cats_eval" / "evaluation.json").is_file()
    table = tinymlp_cli("evaluate", out, "--data", only_cats, "--out", tmp / "cats_eval", cwd=tmp)
    assert table.returncode == 0, table.stderr
    assert "top-1 accuracy" in table.stdout and "top-5 accuracy - (3 classes)" in table.stdout
    assert "precision" in table.stdout and "evaluation_confusion.png" in table.stdout


@pytest.mark.slow
@needs_pillow
def test_evaluate_refusals_are_one_line(folder_run):
    tmp, root, out = folder_run
    strange = tmp / "strange"
    (strange / "cow").mkdir(parents=True)
    (strange / "cow" / "0.png").write_bytes(next((root / "train" / "cat").glob("*.png")).read_bytes())
    for args, words in ((["--data", tmp / "missing"], ["--data", "no such file or folder"]),
                        (["--data", strange], ["cow", "not among the run's classes", "cat, dog, owl"])):
        refused(tinymlp_cli("evaluate", out, *args, cwd=tmp), *words)
    refused(tinymlp_cli("evaluate", tmp / "nothing", cwd=tmp), "no such file or folder")


@pytest.mark.slow
def test_evaluate_a_synthetic_run_and_a_text_run_on_their_test_sets(tmp_path):
    out = tmp_path / "synthetic"
    ok(run("train_cifar_mixer.py", "--dataset", "synthetic", "--synthetic-size", "100", *TINY_IMAGE, "--out", out,
           cwd=tmp_path))
    result = evaluated(out, cwd=tmp_path)
    tested = metrics(out)["test"]
    assert result["examples"] == 20 and result["top1"] == pytest.approx(tested.get("best", tested["last"])["accuracy"])
    assert result["top5"] is not None and 0 <= result["top1"] <= result["top5"] <= 1     # 10 classes

    path = reviews_csv(tmp_path / "reviews.csv")
    text = tmp_path / "text"
    ok(run("train_text_gmlp.py", "--dataset", "csv", "--train-file", path, "--text-column", "review",
           "--label-column", "sentiment", *TINY_TEXT, "--out", text, cwd=tmp_path))
    result = evaluated(text, cwd=tmp_path)
    tested = metrics(text)["test"]
    assert result["examples"] == 6 and result["top1"] == pytest.approx(tested.get("best", tested["last"])["accuracy"])
    whole = evaluated(text, "--data", path, "--out", tmp_path / "whole", cwd=tmp_path)
    assert whole["examples"] == 60 and whole["classes"] == ["neg", "pos"]


def test_evaluate_a_cifar_run_reads_the_cifar_test_split(tmp_path, monkeypatch):
    """A CIFAR-10 run (its checkpoint written here, CIFAR a tiny archive of the real format) is scored
    on the CIFAR test split it records, through the normalisation it records."""
    import tarfile

    import tinymlp as tm
    from test_data import C10_NAMES, make_tiny
    from tinymlp import checkpoint, models
    from tinymlp.data import ARCHIVES
    from tinymlp.evaluate import evaluate_run

    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with tarfile.open(tiny.archive) as tar:
        tar.extractall(root, filter="data")
    model = models.create("mixer_cifar", dim=16, depth=1, token_mlp_dim=8, channel_mlp_dim=16)
    model.head.weight.data[...] = np.random.default_rng(0).normal(size=model.head.weight.shape)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    out = tmp_path / "run"
    out.mkdir()
    checkpoint.save(out / "checkpoint.npz", model, epoch=1, preset="mixer_cifar", model_config=model.config,
                    classes=list(C10_NAMES), dataset="cifar10", args={"dataset": "cifar10", "data_dir": str(root)},
                    preprocess={"kind": "image", "size": 32, "image_size": 32, "mean": mean, "std": std})
    result = evaluate_run(out)
    labels, pixels = tiny.splits["test"]
    images = pixels.reshape(-1, 3, 32, 32) / 255.0
    x = (images - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    with tm.no_grad():
        logits = model.eval()(tm.tensor(x)).numpy().astype(np.float64)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert result["data"] == "the cifar10 test split" and result["examples"] == len(labels) == 3
    assert result["top1"] == pytest.approx(np.mean(p.argmax(axis=1) == labels[:, 0]))
    assert result["loss"] == pytest.approx(-np.mean(np.log(p[np.arange(3), labels[:, 0]])), rel=1e-4)
    assert result["classes"] == list(C10_NAMES) and result["top5"] is not None
