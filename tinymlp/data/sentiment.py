"""Sentiment sets from their official archives: sentence polarity (Pang and Lee) and SST-2 (GLUE).

    train = SentencePolarity(train=True)          # downloads once, then reads the cached files
    test = SST2(train=False)                       # GLUE's dev.tsv: its test.tsv has no labels

Both are ``TextDataset``s (``texts``, ``labels`` 1 positive / 0 negative, ``classes``), read
without pickle (``TEXT_ARCHIVES``, replaceable like CIFAR's ``ARCHIVES`` to use a mirror):

- **Sentence polarity v1.0** (Pang and Lee 2005; ``rt-polaritydata.tar.gz`` from Cornell):
  ``rt-polaritydata/rt-polarity.pos`` and ``rt-polarity.neg``, 5,331 sentences each, one a line,
  lowercased and tokenised, in Latin-1. There is no official split: papers use 10-fold cross-
  validation. Here a fixed seeded permutation puts ``test_fraction`` (10%) of each class in the
  test split. The archive's MD5 is not pinned (it could not be verified from a trusted source
  while writing this); the archive is read only up to ``max_size`` (8 MiB, for an archive of
  about 0.5 MB) and the files are checked by their line counts instead.
- **SST-2** (Socher et al. 2013, as distributed by GLUE: ``SST-2.zip``): ``SST-2/train.tsv``
  (67,349 sentences) and ``SST-2/dev.tsv`` (872), tab-separated with a header ``sentence\tlabel``;
  GLUE's ``test.tsv`` has no labels, so the test split here is ``dev.tsv``. MD5 as pinned by
  torchtext's SST2 loader.

Where the data lives, the download (temporary file, checksum, rename) and the unpacking
(temporary folder, checked, renamed into place) are ``tinymlp.data.archive``'s: ``root``
(``--data-dir``), else $TINYMLP_DATA, else $XDG_CACHE_HOME/tinymlp, else ~/.cache/tinymlp.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .archive import FETCH_AGAIN, MAX_MEMBERS, MAX_UNPACKED, DatasetError, prepare
from .text_loader import TextDataset

__all__ = ["SST2", "TEXT_ARCHIVES", "SentencePolarity", "TextArchive", "prepare_text"]

@dataclass(frozen=True)
class TextArchive:
    """One archive: URLs tried in order, MD5 (None: not pinned), the files it holds inside
    ``folder`` with their line counts (None: not checked), and ``kind`` ("tar.gz" or "zip")."""

    name: str
    urls: tuple
    filename: str
    md5: str | None
    size: int | None              # bytes, for the progress bar when the server does not say
    folder: str
    files: dict
    kind: str
    max_members: int = MAX_MEMBERS        # more members than this: refused, nothing unpacked
    max_unpacked: int = MAX_UNPACKED      # members adding up to more bytes than this: refused
    max_size: int | None = None           # a larger archive (download or file): refused; set where md5 is None


TEXT_ARCHIVES = {
    "polarity": TextArchive(
        name="sentence polarity v1.0",
        urls=("https://www.cs.cornell.edu/people/pabo/movie-review-data/rt-polaritydata.tar.gz",),
        filename="rt-polaritydata.tar.gz", md5=None, size=None, folder="rt-polaritydata",
        files={"rt-polarity.pos": 5331, "rt-polarity.neg": 5331}, kind="tar.gz",
        max_size=8 << 20,         # the archive is about 0.5 MB; without an MD5, a size limit
    ),
    "sst2": TextArchive(
        name="SST-2",
        urls=("https://dl.fbaipublicfiles.com/glue/data/SST-2.zip",),
        filename="SST-2.zip", md5="9f81648d4199384278b86e315dac217c", size=None, folder="SST-2",
        files={"train.tsv": 67_350, "dev.tsv": 873}, kind="zip",    # with their header lines
    ),
}


def _how_to_fix(spec, root):
    return (f"To use a copy you already have, pass its folder (the one holding {spec.folder}/ or "
            f"{spec.filename}) as root=... (--data-dir in the examples) or set TINYMLP_DATA; it is "
            f"looked for in {root}. To work without it, use a generated set: tinymlp.data.OrderTask "
            f"or PairMatchTask (--dataset synthetic in the examples).")


def prepare_text(spec: TextArchive, root=None, download=True, progress=True) -> Path:
    """Make sure ``root/spec.folder`` holds the checked files; return that folder
    (``tinymlp.data.archive.prepare`` with the line counts as the check)."""
    return prepare(spec, root, download, progress, check=_check_files, advice=_how_to_fix)


def _lines(path):
    return path.read_bytes().decode("latin-1").splitlines()


def _utf8_lines(path, folder):
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DatasetError(f"{path}, line {line}: the bytes are not UTF-8 (the file is corrupted); delete "
                           f"{folder} and {FETCH_AGAIN}.") from None


def _check_files(spec, folder, fix):
    for name, count in spec.files.items():
        path = folder / name
        if not path.is_file():
            raise DatasetError(f"{path} is missing. {fix}")
        if count is not None and (n := len(_lines(path))) != count:
            raise DatasetError(f"{path} is truncated or corrupted: {n} lines, expected {count}. {fix}")


class SentencePolarity(TextDataset):
    """Pang and Lee's 10,662 movie-review sentences: label 1 positive, 0 negative; a seeded
    ``test_fraction`` of each class is the test split (there is no official one)."""

    def __init__(self, root=None, train=True, download=True, progress=True, test_fraction=0.1, seed=0):
        spec = TEXT_ARCHIVES["polarity"]
        self.root = prepare_text(spec, root, download, progress)
        texts, labels = [], []
        for label, name in ((0, "rt-polarity.neg"), (1, "rt-polarity.pos")):
            lines = [s.strip() for s in _lines(self.root / name)]
            order = np.random.default_rng([seed, label]).permutation(len(lines))
            n_test = int(round(test_fraction * len(lines)))
            keep = order[n_test:] if train else order[:n_test]
            texts += [lines[i] for i in sorted(keep)]
            labels += [label] * len(keep)
        super().__init__(texts, labels, ("negative", "positive"), name="SentencePolarity")
        self.train = train


class SST2(TextDataset):
    """SST-2 from GLUE: train.tsv (train=True) or dev.tsv (train=False, GLUE's test has no labels);
    label 1 positive, 0 negative."""

    def __init__(self, root=None, train=True, download=True, progress=True):
        spec = TEXT_ARCHIVES["sst2"]
        self.root = prepare_text(spec, root, download, progress)
        path = self.root / ("train.tsv" if train else "dev.tsv")
        rows = _utf8_lines(path, self.root)
        if not rows or rows[0].split("\t") != ["sentence", "label"]:
            raise DatasetError(f"{path}: expected the header 'sentence<TAB>label'. Delete {self.root} and "
                               f"{FETCH_AGAIN}.")
        texts, labels = [], []
        for k, row in enumerate(rows[1:], start=2):
            sentence, _, label = row.rpartition("\t")
            if label not in ("0", "1"):
                raise DatasetError(f"{path}, line {k}: label {label!r} is not 0 or 1; the file is corrupted.")
            texts.append(sentence.strip())
            labels.append(int(label))
        super().__init__(texts, labels, ("negative", "positive"), name="SST2")
        self.train = train
