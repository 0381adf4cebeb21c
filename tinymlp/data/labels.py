"""The class and label rules every format shares: image folders, ``.npz`` arrays and CSV/TSV text.

    classes, ids = number_labels(["pos", "neg", "pos"], "reviews.csv")   # ["neg", "pos"], [1, 0, 1]
    check_class_names(["cat", "dog"], "pets/train")                      # at least two, distinct
    train, held = held_out_split(labels, fraction=0.1, seed=0)          # stratified, seeded

The rules, the same whichever file the examples come from, and the same in every process:

- a class name is text in Unicode NFC (``class_name``): bytes (an ``.npz`` array of ``S`` strings)
  are decoded as UTF-8, and "café" typed with a combining accent is the same name as "café" typed
  with "é", as they look the same;
- the classes are the distinct labels, sorted (as numbers when every label is a number, as text,
  code point by code point, otherwise), numbered 0..K-1, and their text is kept as the class
  names: labels 0/1 stay 0/1; "neg"/"pos" become 0/1 named "neg"/"pos"; labels 1..3 become 0..2
  named "1".."3"; folders 1, 2, 10 are classes 0, 1, 2 in that order;
- a classifier needs at least two classes: one class is refused, in one sentence naming the file;
- two names that would be two classes but read as one are refused, naming both: one number written
  two ways ("01" and "1", "1.0" and "1": which would the class be called?), two folders whose names
  are one name in two Unicode forms, and two names that differ only in case ("Food" and "food"):
  on most laptops (macOS, Windows) two such folders cannot even both exist, so a set that has
  them was almost always merged from two sources by accident; write them alike, or rename one;
- a test (or validation) split is numbered by the training split's classes: a label the
  training split does not have is refused.
"""

from __future__ import annotations

import os
import re
import unicodedata
from decimal import Decimal

import numpy as np

from .archive import DatasetError

__all__ = ["check_class_names", "class_name", "class_names", "held_out_split", "label_order", "number_labels"]

NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")     # 3, -2, 0.5, 1e3: not "nan", "1_0"


def class_names(values, where, kind="class") -> list:
    """``class_name`` of each of ``values``, after ``check_class_names`` on them as they were given
    (so that two forms of one name are named, not merged)."""
    given = [class_name(v, where, normalize=False) for v in values]
    check_class_names(given, where, kind)
    return [unicodedata.normalize("NFC", v) for v in given]


def class_name(value, where="a class name", normalize=True) -> str:
    """``value`` as a class name: text in Unicode NFC (``normalize``), bytes decoded as UTF-8 (a
    DatasetError naming ``where`` when they are not), numbers as their text."""
    if isinstance(value, (bytes, np.bytes_)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise DatasetError(f"{where}: the class name {bytes(value)!r} is not UTF-8 text; store class names as "
                               "UTF-8 (or as a string array)") from None
    value = str(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:           # a file name's undecodable bytes, kept as surrogates by os.fsdecode
        raise DatasetError(f"{where}: the class name {os.fsencode(value)!r} is not UTF-8 text; rename it") from None
    return unicodedata.normalize("NFC", value) if normalize else value


def _number(name: str):
    return Decimal(name) if NUMBER.fullmatch(name) else None


def label_order(values) -> list:
    """The distinct labels, sorted as numbers when they all are (``Decimal``: exact), else as text."""
    distinct = {str(v) for v in values}
    numbers = {v: _number(v) for v in distinct}
    if distinct and all(n is not None for n in numbers.values()):
        return sorted(distinct, key=lambda v: (numbers[v], v))    # the text breaks ties: refused later
    return sorted(distinct)


def check_class_names(names, where, kind="class"):
    """Refuse fewer than two classes, or two names that would be two classes but read as one (one
    number written two ways, one name in two Unicode forms, names that differ only in case), naming
    ``where``; ``kind`` is what a class is in that file ("class folder", "label")."""
    names = [str(n) for n in names]
    if len(names) < 2:
        found = f"only one {kind}, {names[0]!r}" if names else f"no {kind}"
        raise DatasetError(f"{where}: {found}; a classifier needs at least two classes")
    seen = {}
    for name in names:
        if ("name", name) in seen:
            raise DatasetError(f"{where}: the {kind} {name!r} is given twice")
        seen["name", name] = name
        same = unicodedata.normalize("NFC", name)
        number = _number(name)
        rules = [(("form", same), "are one name written in two Unicode forms (NFC and NFD, which look alike); "
                                  "rename one"),
                 (("case", same.casefold()), "differ only in case, which makes them two classes; write them alike "
                                             "to merge them, or rename one if they are meant to be two")]
        if number is not None:
            rules.insert(1, (("number", number), "are the same number written two ways, which would make them two "
                                                 "classes; write them alike"))
        for key, why in rules:
            first = seen.setdefault(key, name)
            if first != name:                # two Unicode forms look alike: shown with their code points
                shown = f"{first!a} and {name!a}" if key[0] == "form" else f"{first!r} and {name!r}"
                raise DatasetError(f"{where}: the {kind}s {shown} {why}")


def number_labels(values, where, classes=None, what="label"):
    """(class names, int64 ids) of the labels ``values`` (strings, bytes or integers; ``class_name``).

    Without ``classes`` the classes are ``values``' own (``label_order``; at least two, checked by
    ``check_class_names``); with them (a test split takes the training split's), a label that is
    not one of them is refused."""
    text = [class_name(v, where) for v in values]
    if classes is None:
        classes = label_order(text)
        check_class_names(classes, where, what)
    else:
        classes = [class_name(c, where) for c in classes]
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
