"""Your own text: a labelled CSV/TSV file, or a plain file of one text a line.

    train = read_text_table("reviews.csv", text_column="text", label_column="label")
    test = read_text_table("reviews_test.csv", "text", "label", classes=train.classes)
    train, test = split_text_dataset(train, test_fraction=0.1, seed=0)   # no test file: hold some out
    lines = read_lines("corpus.txt")                                     # masked-LM pretraining

``read_text_table`` gives a ``TextDataset`` (``texts``, ``pairs`` with ``pair_column``, ``labels``,
``classes``), the record the built-in text sets use, so ``encode``, ``TokenLoader`` and ``fit``
take it as they take those.

The file: UTF-8 (a byte-order mark is allowed), a header line naming the columns, then one
example a row. Tab-separated for ``.tsv``/``.tab`` files and when the header holds a tab,
comma-separated otherwise; CSV quoting rules apply to comma-separated files (a text with commas
or line breaks sits inside double quotes), while a TSV's quotes are ordinary characters (as in
GLUE's files). Empty lines are skipped.

Labels follow the rules every format shares (``tinymlp.data.labels``): the distinct values of
the label column, sorted (as numbers when every one is an integer), are the classes, numbered
0..K-1, and their text is kept as the class names: labels 0/1 stay 0/1; "neg"/"pos" become 0/1
named "neg"/"pos"; 1..5 stars become 0..4 named "1".."5". One class, or two labels that differ
only in case ("Food", "food"), are refused. A test file is read with the training file's
``classes``: a label the training file does not have is refused.

Every problem is one ``DatasetError`` naming the file, and the line and column where it has one.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from .archive import DatasetError
from .labels import held_out_split, number_labels
from .text_loader import TextDataset

__all__ = ["numbered_lines", "read_lines", "read_text_table", "split_text_dataset"]


def _read_text(path) -> str:
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such file")
    if not path.is_file():
        raise DatasetError(f"{path}: not a file")
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DatasetError(f"{path}, line {line}: not UTF-8 text (byte {raw[err.start]:#04x}); save the "
                           "file as UTF-8") from None


def read_lines(path) -> list:
    """The non-empty lines of a UTF-8 text file, stripped: one text a line (masked-LM pretraining)."""
    return [line for _, line in numbered_lines(path)]


def numbered_lines(path) -> list:
    """(line number counted from 1, text) of each non-empty line of a UTF-8 text file, stripped."""
    lines = [(n, line.strip()) for n, line in enumerate(_read_text(path).splitlines(), start=1)]
    return [(n, line) for n, line in lines if line]


def _delimiter(path: Path, header: str) -> str:
    if path.suffix.lower() in (".tsv", ".tab"):
        return "\t"
    if path.suffix.lower() == ".csv":
        return ","
    return "\t" if "\t" in header else ","


def _column(header, name, path, flag):
    if name in header:
        return header.index(name)
    stripped = [h.strip() for h in header]
    if name.strip() in stripped:
        return stripped.index(name.strip())
    raise DatasetError(f"{path}: no column {name!r} ({flag}); its header has {', '.join(map(repr, header))}")


def read_text_table(path, text_column="text", label_column="label", pair_column=None, classes=None,
                    name=None) -> TextDataset:
    """A labelled ``TextDataset`` from a CSV or TSV file with a header line.

    ``pair_column``: a second text column for sentence-pair tasks (``[CLS] a [SEP] b [SEP]``).
    ``classes``: the class names to number the labels by (a test file takes the training file's);
    by default the file's own distinct labels, sorted. ``label_column=None`` reads texts alone
    (every label 0), e.g. for masked-LM pretraining on a table's texts.
    """
    path = Path(path)
    text = _read_text(path)
    first = io.StringIO(text, newline="").readline()
    if not first.strip():
        raise DatasetError(f"{path}: empty, or no header line naming the columns on line 1")
    delimiter = _delimiter(path, first)
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting, strict=True)
    try:
        header = next(reader)
        columns = [("--text-column", text_column)] + ([("--label-column", label_column)] if label_column else [])
        columns += [("--pair-column", pair_column)] if pair_column else []
        index = {flag: _column(header, col, path, flag) for flag, col in columns}
        texts, pairs, labels = [], [], []
        for row in reader:
            line = reader.line_num
            if not row or (len(row) == 1 and not row[0].strip()):
                continue                                             # an empty line
            if len(row) != len(header):
                raise DatasetError(f"{path}, line {line}: {len(row)} fields, but the header has {len(header)} "
                                   f"(a {'tab' if delimiter == chr(9) else 'comma'} inside a text? "
                                   f"{'quote the text' if delimiter == ',' else 'a TSV text cannot hold tabs'})")
            for flag, col in columns:
                if not row[index[flag]].strip():
                    raise DatasetError(f"{path}, line {line}: the column {col!r} ({flag}) is empty")
            texts.append(row[index["--text-column"]].strip())
            if pair_column:
                pairs.append(row[index["--pair-column"]].strip())
            if label_column:
                labels.append(row[index["--label-column"]].strip())
    except csv.Error as err:
        hint = " (a double quote that is never closed?)" if "end of data" in str(err) else ""
        raise DatasetError(f"{path}, line {reader.line_num}: {err}{hint}") from None
    if not texts:
        raise DatasetError(f"{path}: a header but no rows")
    if not label_column:
        ids, classes = np.zeros(len(texts), dtype=np.int64), ()
    else:
        classes, ids = number_labels(labels, f"{path} (column {label_column!r})", classes)
    return TextDataset(texts, ids, classes, pairs=pairs if pair_column else None, name=name or path.name)


def split_text_dataset(dataset: TextDataset, test_fraction=0.1, seed=0, held_out="test"):
    """(kept, held out): ``test_fraction`` of each class held out, chosen by ``seed`` (stratified);
    ``held_out`` names the held-out part ("test", "validation") in its name and in the errors."""
    keep_index, held_index = held_out_split(dataset.labels, test_fraction, seed)
    if len(held_index) == 0:
        raise DatasetError(f"{dataset.name}: too few rows to hold {test_fraction:g} of each class out for "
                           f"{held_out}; " + ("give a test file" if held_out == "test" else
                                              "give more rows, or pass --val-fraction 0"))

    def part(index, suffix):
        pairs = None if dataset.pairs is None else [dataset.pairs[i] for i in index]
        return TextDataset([dataset.texts[i] for i in index], dataset.labels[index], dataset.classes,
                           pairs=pairs, name=f"{dataset.name} ({suffix})")

    return part(keep_index, "train"), part(held_index, f"held-out {test_fraction:g}, {held_out}")
