"""The class and label rules every format shares: image folders, ``.npz`` arrays and CSV/TSV text.

    classes, ids = number_labels(["pos", "neg", "pos"], "reviews.csv")   # ("neg", "pos"), [1, 0, 1]
    check_class_names(["cat", "dog"], "pets/train")                      # at least two, distinct
    train, held = held_out_split(labels, fraction=0.1, seed=0)          # stratified, seeded

The rules, the same whichever file the examples come from:

- the classes are the distinct labels, sorted (as numbers when every label is an integer, as text
  otherwise), numbered 0..K-1, and their text is kept as the class names: labels 0/1 stay 0/1;
  "neg"/"pos" become 0/1 named "neg"/"pos"; labels 1..3 become 0..2 named "1".."3";
- a classifier needs at least two classes: one class is refused, in one sentence naming the file;
- two class names that differ only in case ("Food" and "food") are refused: on most laptops
  (macOS, Windows) two such folders cannot even both exist, so a set that has them was
  almost always merged from two sources by accident; write them alike, or rename one;
- a test (or validation) split is numbered by the training split's classes: a label the
  training split does not have is refused.
"""

from __future__ import annotations

import numpy as np

from .archive import DatasetError

__all__ = ["check_class_names", "held_out_split", "label_order", "number_labels"]


def label_order(values) -> list:
    """The distinct labels, sorted as integers when they all are, else as text."""
    distinct = set(values)
    try:
        return sorted(distinct, key=lambda v: int(v))
    except (TypeError, ValueError):
        return sorted(distinct, key=str)


def check_class_names(names, where, kind="class"):
    """Refuse fewer than two classes, or two names that differ only in case, naming ``where``;
    ``kind`` is what a class is in that file ("class folder", "label")."""
    names = [str(n) for n in names]
    if len(names) < 2:
        found = f"only one {kind}, {names[0]!r}" if names else f"no {kind}"
        raise DatasetError(f"{where}: {found}; a classifier needs at least two classes")
    folded = {}
    for name in names:
        key = name.casefold()
        if key in folded:
            raise DatasetError(f"{where}: the {kind}s {folded[key]!r} and {name!r} differ only in case, which makes "
                               "them two classes; write them alike to merge them, or rename one if they are "
                               "meant to be two")
        folded[key] = name


def number_labels(values, where, classes=None, what="label"):
    """(class names, int64 ids) of the labels ``values`` (strings or integers).

    Without ``classes`` the classes are ``values``' own (``label_order``; at least two, checked by
    ``check_class_names``); with them (a test split takes the training split's), a label that is
    not one of them is refused."""
    text = [str(v) for v in values]
    if classes is None:
        classes = [str(c) for c in label_order(text)]
        check_class_names(classes, where, what)
    else:
        classes = [str(c) for c in classes]
    number = {c: k for k, c in enumerate(classes)}
    ids = np.empty(len(text), dtype=np.int64)
    for i, label in enumerate(text):
        if label not in number:
            raise DatasetError(f"{where}: the {what} {label!r} is not a class of the training data "
                               f"({', '.join(classes)})")
        ids[i] = number[label]
    return classes, ids


def held_out_split(labels, fraction=0.1, seed=0):
    """(kept indices, held-out indices): ``fraction`` of each class, chosen by ``seed``, held out.

    Stratified: a class of n examples gives round(fraction n) of them to the held-out part (none
    when n = 1, so that every class is trained on).
    """
    if isinstance(fraction, bool) or not 0 < fraction < 1:
        raise ValueError(f"held_out_split: fraction must be in (0, 1), got {fraction!r}")
    labels = np.asarray(labels)
    kept, held = [], []
    for k in np.unique(labels):
        where = np.flatnonzero(labels == k)
        order = np.random.default_rng([seed, int(k)]).permutation(len(where))
        n_held = min(int(round(fraction * len(where))), len(where) - 1)
        held.append(where[order[:n_held]])
        kept.append(where[order[n_held:]])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))
