"""Evaluate a trained model on labelled data: top-1 and top-5 accuracy, the loss, and each class's
precision, recall and accuracy, as numbers (JSON) and as a confusion matrix.

    python -m tinymlp evaluate runs/pets                    # the run's own test set, read as training read it
    python -m tinymlp evaluate runs/pets --data photos/     # other labelled data: a folder of class folders
    python -m tinymlp evaluate runs/cifar --json            # the numbers as JSON on stdout

    result = evaluate_run("runs/pets")                      # the same dict, in Python
    scores(probabilities, labels, classes)                  # the numbers of any (N, K) probabilities

The model is the run folder's ``best.npz``, else its ``checkpoint.npz`` (or a checkpoint file),
and runs through the pipeline its own evaluation ran (``tinymlp.predict``). Without ``--data``
the data is the run's test set, rebuilt from the flags its checkpoint records: CIFAR-10/100 and
the generated sets, your own folder, ``.npz`` or CSV file with the same held-out split (same
fraction, same seed), so that the top-1 accuracy is the test accuracy the run reported. ``--data``
takes a folder of class folders (or one holding a ``test/`` folder of them), an ``.npz`` file
(its ``x_test, y_test``), a CSV/TSV file for a text model (the run's columns), or the name of a
built-in set (``cifar10``, ``cifar100``, ``polarity``, ``sst2``); its class names must be
classes of the run (a subset is fine).

The numbers, for K classes and N examples, with ``C[i, j]`` the count of class-i examples
predicted j (the confusion matrix, rows the true class):

- ``top1``: the share of examples whose most probable class is the true one; ``top5``: whose
  true class is among the five most probable (None with 5 classes or fewer, where it is always 1);
- ``loss``: the mean cross-entropy, -log p(true class);
- per class c: ``precision`` = C[c, c] / sum_i C[i, c] (of the examples predicted c, the share
  that are c), ``recall`` = C[c, c] / sum_j C[c, j] (of the examples of c, the share found),
  ``accuracy``: of the examples of c, the share classified right, which is the recall (as
  PyTorch's CIFAR tutorial and torchmetrics' per-class accuracy count it); ``support``: the
  examples of c. A ratio with nothing to count (no example of c, nothing predicted c) is None.

Every problem is one sentence: a checkpoint without classes, data that cannot be found, a class
the run does not know.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from . import checkpoint, plot
from .backend import CudaUnavailableError
from .checkpoint import CheckpointError
from .data import (
    DATASETS, DatasetError, SyntheticImages, get_dataset, get_text_dataset, held_out_split,
    read_text_table, split_text_dataset,
)
from .data.folder import ImageFolder, class_folders, has_class_folders, load_npz, subset
from .files import atomic_write
from .predict import PredictError, checkpoint_path, load

__all__ = ["CONFUSION_FILE", "EvaluateError", "JSON_FILE", "evaluate_run", "main", "run_test_set", "scores"]

JSON_FILE = "evaluation.json"
CONFUSION_FILE = "evaluation_confusion.png"
TOP_K = 5
SENTIMENT = ("polarity", "sst2")           # the text sets that have a test split on disk


class EvaluateError(ValueError):
    """Data evaluate cannot score: labels the run does not know, no data recorded, ..."""


# ---------------------------------------------------------------------- the numbers
def scores(probabilities, labels, classes) -> dict:
    """top1, top5, loss, per-class precision/recall/accuracy/support and the confusion matrix
    (rows: the true class) of ``probabilities`` (N, K) against integer ``labels`` (N,)."""
    p = np.asarray(probabilities, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    k = len(classes)
    if p.ndim != 2 or p.shape != (len(labels), k):
        raise EvaluateError(f"scores: probabilities of shape {p.shape} for {len(labels)} labels and {k} classes")
    if not len(labels):
        raise EvaluateError("scores: no examples to score")
    if labels.min() < 0 or labels.max() >= k:
        raise EvaluateError(f"scores: labels must lie in 0..{k - 1}, got {labels.min()}..{labels.max()}")
    guess = p.argmax(axis=1)
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (labels, guess), 1)
    rank = (p > p[np.arange(len(labels)), labels][:, None]).sum(axis=1)      # classes ranked above the true one
    support, predicted, hits = confusion.sum(axis=1), confusion.sum(axis=0), np.diag(confusion)

    def ratio(a, b):
        return float(a / b) if b else None

    per_class = {str(name): {"precision": ratio(hits[c], predicted[c]), "recall": ratio(hits[c], support[c]),
                             "accuracy": ratio(hits[c], support[c]), "support": int(support[c])}
                 for c, name in enumerate(classes)}
    true_p = np.maximum(p[np.arange(len(labels)), labels], np.finfo(np.float64).tiny)
    return {"examples": int(len(labels)), "top1": float(np.mean(guess == labels)),
            "top5": float(np.mean(rank < TOP_K)) if k > TOP_K else None,
            "loss": float(-np.mean(np.log(true_p))), "classes": [str(c) for c in classes],
            "per_class": per_class, "confusion": confusion.tolist()}


# ---------------------------------------------------------------------- the data
def run_test_set(meta, size=None, classes=None):
    """(description, dataset) of the test set a run was evaluated on, rebuilt from its checkpoint's
    ``meta`` (``dataset`` and ``args``) as the example scripts build it: the same files, the same
    held-out fraction and seed. ``size``: the image side the run read its images at."""
    args = meta.get("args") if isinstance(meta.get("args"), dict) else {}
    name = meta.get("dataset", args.get("dataset"))
    text = (meta.get("preprocess") or {}).get("kind") == "text" or "tokenizer" in meta
    where = args.get("data_dir")
    if name is None:
        raise EvaluateError("the checkpoint does not record the data it was trained on: give --data")
    if text:
        return _text_test_set(name, args, classes)
    if name == "synthetic":
        n = max(10, int(args.get("synthetic_size", 10_000)) // 5)
        return f"{n} generated test images", SyntheticImages(n, seed=0, train=False)
    if name in DATASETS:
        return f"the {name} test split", get_dataset(name, train=False, root=where, download=False,
                                                           progress=False)
    if name == "npz":
        return f"x_test, y_test of {where}", load_npz(where, size=size)[1]
    if name == "folder":
        return _folder_test_set(Path(where), size, float(args.get("test_fraction", 0.1)))
    raise EvaluateError(f"the run was trained on --dataset {name}, which evaluate cannot rebuild: give --data")


def _folder_test_set(root, size, fraction):
    """A --dataset folder run's test set: test/ when there is one, else the held-out fraction (seed 0)."""
    if not (root / "train").is_dir() and has_class_folders(root):                 # torchvision's root/<class>/
        every = ImageFolder(root, None, size=size)
        return (f"{fraction:g} of each class of {root}, held out by a fixed seed",
                subset(every, held_out_split(every.labels, fraction, seed=0)[1]))
    if (root / "test").exists():
        train_classes = class_folders(root / "train") if (root / "train").is_dir() else None
        return f"{root / 'test'}/", ImageFolder(root, "test", size=size, classes=train_classes)
    every = ImageFolder(root, "train", size=size)
    return (f"{fraction:g} of each class of {root / 'train'}, held out by a fixed seed",
            subset(every, held_out_split(every.labels, fraction, seed=0)[1]))


def _text_test_set(name, args, classes):
    if name == "synthetic":
        task = args.get("synthetic_task", "order")
        n = max(10, int(args.get("synthetic_size", 2000)) // 5)
        return f"{n} generated test examples ({task})", get_text_dataset(task, num_examples=n,
                                                                              seed=args.get("seed", 0), train=False)
    if name in SENTIMENT:
        return f"the {name} test split", get_text_dataset(name, train=False, root=args.get("data_dir"),
                                                                download=False, progress=False)
    if name == "csv":
        columns = (args.get("text_column", "text"), args.get("label_column", "label"), args.get("pair_column"))
        if args.get("test_file"):
            return args["test_file"], read_text_table(args["test_file"], *columns, classes=classes)
        every = read_text_table(args["train_file"], *columns, classes=classes)
        fraction = float(args.get("test_fraction", 0.1))
        return (f"{fraction:g} of each class of {args['train_file']}, held out by a fixed seed",
                split_text_dataset(every, fraction, seed=0)[1])
    raise EvaluateError(f"the run was trained on --dataset {name}, which evaluate cannot rebuild: give --data")


def given_data(given, predictor, meta, data_dir=None):
    """(description, dataset) of ``--data``: a built-in set's name, a folder, an .npz or a CSV/TSV file."""
    args = meta.get("args") if isinstance(meta.get("args"), dict) else {}
    if predictor.kind == "text":
        if given in SENTIMENT + ("synthetic",) and not Path(given).exists():
            return _text_test_set(given, {**args, "data_dir": data_dir}, predictor.classes)
        columns = (args.get("text_column", "text"), args.get("label_column", "label"), args.get("pair_column"))
        path = Path(given)
        if path.is_dir() or not path.exists():
            raise EvaluateError(f"--data {given}: {'a folder' if path.is_dir() else 'no such file'}; a text model is "
                                "evaluated on a CSV or TSV file (columns as its run's), polarity, sst2 or synthetic")
        return str(path), read_text_table(path, *columns, classes=list(predictor.classes))
    if given in DATASETS and not Path(given).exists():
        if given == "synthetic":
            return run_test_set({"dataset": "synthetic", "args": args})
        return f"the {given} test split", get_dataset(given, train=False, root=data_dir, download=False,
                                                           progress=False)
    path = Path(given)
    if path.is_file():
        return f"x_test, y_test of {path}", load_npz(path, size=predictor.size)[1]
    if not path.is_dir():
        raise EvaluateError(f"--data {given}: no such file or folder (expected a folder of class folders, an .npz "
                            "file, or cifar10, cifar100, synthetic)")
    if not has_class_folders(path) and (path / "test").is_dir():
        path = path / "test"
    names = class_folders(path)
    return f"{path}/", ImageFolder(path, None, size=predictor.size, classes=names or None)


def _labels_in(dataset, classes, source):
    """The dataset's labels numbered by the run's ``classes`` (matched by name)."""
    index = {name: k for k, name in enumerate(classes)}
    unknown = [str(c) for c in dataset.classes if str(c) not in index]
    if unknown:
        raise EvaluateError(f"{source}: the class{'es' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                            f"{'are' if len(unknown) > 1 else 'is'} not among the run's classes "
                            f"({', '.join(classes)})")
    mapping = np.array([index[str(c)] for c in dataset.classes], dtype=np.int64)
    return mapping[np.asarray(dataset.labels, dtype=np.int64)]


# ---------------------------------------------------------------------- a run
def evaluate_run(run, data=None, device="cpu", batch_size=256, data_dir=None) -> dict:
    """The scores of the model of ``run`` (a run folder or a checkpoint file) on ``data`` (see
    ``given_data``; None: the run's own test set), with where they come from."""
    path = checkpoint_path(run)
    predictor = load(path, device, batch_size=batch_size)
    meta = checkpoint.read_meta(path)
    if data is None:
        described, dataset = run_test_set(meta, predictor.size, predictor.classes)
    else:
        described, dataset = given_data(str(data), predictor, meta, data_dir)
    labels = _labels_in(dataset, predictor.classes, described)
    if predictor.kind == "text":
        inputs = dataset.texts if dataset.pairs is None else list(zip(dataset.texts, dataset.pairs))
    else:
        inputs = dataset.images
    result = scores(predictor.probabilities(inputs), labels, predictor.classes)
    return {"checkpoint": str(path), "epoch": meta.get("epoch"), "model": type(predictor.model).__name__,
            "data": described, **result}


# ---------------------------------------------------------------------- the command line
def _percent(value):
    return "-" if value is None else f"{100 * value:.2f}%"


def report(result) -> str:
    """The scores as a table: top-1, top-5 and the loss, then one row per class."""
    k = len(result["classes"])
    top5 = _percent(result["top5"]) if result["top5"] is not None else f"- ({k} classes)"
    lines = [f"{result['model']} ({result['checkpoint']}, epoch {result['epoch']}) on {result['data']}: "
             f"{result['examples']:,} examples, {k} classes",
             f"top-1 accuracy {_percent(result['top1'])} | top-5 accuracy {top5} | loss {result['loss']:.4f}"]
    width = max(8, *(len(c) for c in result["classes"]))
    lines.append(f"{'class':{width}s}  precision     recall   accuracy  examples")
    for name, row in result["per_class"].items():
        lines.append(f"{name:{width}s}  {_percent(row['precision']):>9s}  {_percent(row['recall']):>9s}  "
                     f"{_percent(row['accuracy']):>9s}  {row['support']:8,d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    """``python -m tinymlp evaluate``: the exit status (0 ok, 2 a problem said in one line)."""
    p = argparse.ArgumentParser(
        prog="python -m tinymlp evaluate",
        description="Score a trained model on labelled data: top-1 and top-5 accuracy, the loss, each class's "
                    f"precision, recall and accuracy ({JSON_FILE}), and the confusion matrix ({CONFUSION_FILE}).")
    p.add_argument("model", metavar="RUN_OR_CHECKPOINT",
                   help="a run's --out folder (its best.npz, else checkpoint.npz) or a checkpoint file")
    p.add_argument("--data", default=None, metavar="DATA",
                   help="a folder of class folders (or one holding test/), an .npz (x_test, y_test), a CSV/TSV file "
                        "for a text model, or cifar10, cifar100, synthetic, polarity, sst2 (default: the run's own "
                        "test set)")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="with --data cifar10|cifar100|polarity|sst2: the folder holding its files (default: "
                        "$TINYMLP_DATA, else the cache folder training uses)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"where {JSON_FILE} and {CONFUSION_FILE} are written (default: the run's folder)")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON instead of a table")
    p.add_argument("--batch-size", type=int, default=256, metavar="N", help="examples per forward pass")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs")
    args = p.parse_args(argv)
    try:
        result = evaluate_run(args.model, args.data, args.device, args.batch_size, args.data_dir)
        out = Path(args.out) if args.out else checkpoint_path(args.model).parent
        out.mkdir(parents=True, exist_ok=True)
        picture = out / CONFUSION_FILE
        text = json.dumps({**result, "confusion_png": str(picture)}, indent=1, ensure_ascii=False) + "\n"
        atomic_write(out / JSON_FILE, lambda f: f.write(text), what=JSON_FILE, binary=False)
        truth = np.repeat(np.arange(len(result["classes"])), np.sum(result["confusion"], axis=1))
        guess = np.concatenate([np.repeat(np.arange(len(row)), row) for row in result["confusion"]])
        plot.confusion_matrix(truth, guess, result["classes"], picture,
                              title=f"{result['model']} on {result['data']}")
    except (EvaluateError, PredictError, CheckpointError, DatasetError, CudaUnavailableError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(text, end="")
    else:
        print(report(result))
        print(f"written: {out / JSON_FILE}, {picture}")
    return 0
