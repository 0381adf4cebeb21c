"""CIFAR-10 and CIFAR-100 from the official binary archives: what they hold, and reading them.

The binary archives hold fixed-size records, read here with NumPy alone (no pickle):

- CIFAR-10 (``cifar-10-binary.tar.gz`` -> ``cifar-10-batches-bin/``): ``data_batch_1.bin`` ..
  ``data_batch_5.bin`` (train) and ``test_batch.bin``, 10,000 records each; a record is
  1 label byte + 3,072 pixel bytes. Label names: ``batches.meta.txt``, one per line.
- CIFAR-100 (``cifar-100-binary.tar.gz`` -> ``cifar-100-binary/``): ``train.bin`` (50,000)
  and ``test.bin`` (10,000); a record is 1 coarse label byte, 1 fine label byte, 3,072 pixel
  bytes. Label names: ``coarse_label_names.txt`` (20) and ``fine_label_names.txt`` (100).

The 3,072 pixel bytes are the red, then green, then blue 32 x 32 plane, each row-major, so
``pixels.reshape(-1, 3, 32, 32)`` is NCHW as it stands.

Where the data lives, the download (temporary file, MD5, rename), the bounded unpacking and the
messages without the network are ``tinymlp.data.archive``'s. A folder that already holds the
extracted files, complete (every record file of exactly the right size), is used as it is.

``ARCHIVES`` describes each archive (URLs tried in order, MD5, record counts); replace an
entry to use a mirror, e.g. ``ARCHIVES["cifar10"] = dataclasses.replace(ARCHIVES["cifar10"],
urls=("https://mirror.example/cifar-10-binary.tar.gz",))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .archive import FETCH_AGAIN, MAX_MEMBERS, MAX_UNPACKED, DatasetError, prepare
from .loader import ImageDataset

__all__ = [
    "ARCHIVES", "CIFAR10", "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100", "CIFAR100_MEAN",
    "CIFAR100_STD", "Archive",
]

# Per-channel mean and standard deviation of the training pixels on the [0, 1] scale.
# (The often copied C10 std (0.2023, 0.1994, 0.2010) is not the per-channel pixel std.)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)

IMAGE_BYTES = 3 * 32 * 32


@dataclass(frozen=True)
class Archive:
    """What one archive holds and where to get it.

    ``train``/``test`` map each record file to its number of records; ``label_files`` lists,
    in the order of the label bytes that start each record, the file of label names and how
    many classes it names.
    """

    name: str
    urls: tuple
    filename: str
    md5: str
    size: int                     # bytes, for the progress bar when the server does not say
    folder: str
    train: dict
    test: dict
    label_files: tuple
    kind: str = "tar.gz"          # or "zip"
    max_members: int = MAX_MEMBERS        # more members than this: refused, nothing unpacked
    max_unpacked: int = MAX_UNPACKED      # members adding up to more bytes than this: refused
    max_size: int | None = None           # a larger archive (download or file): refused

    @property
    def record_bytes(self) -> int:
        return len(self.label_files) + IMAGE_BYTES


ARCHIVES = {
    "cifar10": Archive(
        name="CIFAR-10",
        urls=("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
        filename="cifar-10-binary.tar.gz",
        md5="c32a1d4ab5d03f1284b67883e8d87530",
        size=170_052_171,
        folder="cifar-10-batches-bin",
        train={f"data_batch_{i}.bin": 10_000 for i in range(1, 6)},
        test={"test_batch.bin": 10_000},
        label_files=(("batches.meta.txt", 10),),
    ),
    "cifar100": Archive(
        name="CIFAR-100",
        urls=("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",),
        filename="cifar-100-binary.tar.gz",
        md5="03b5dce01913d631647c71ecec9e9cb8",
        size=168_513_733,
        folder="cifar-100-binary",
        train={"train.bin": 50_000},
        test={"test.bin": 10_000},
        label_files=(("coarse_label_names.txt", 20), ("fine_label_names.txt", 100)),
    ),
}


def _how_to_fix(spec: Archive, root: Path) -> str:
    return (
        f"To use a copy you already have, pass its folder (the one holding {spec.folder}/ or "
        f"{spec.filename}) as root=... (--data-dir in the examples) or set TINYMLP_DATA; it is "
        f"looked for in {root}. To work without it, use the generated set: "
        f"tinymlp.data.SyntheticImages (--dataset synthetic in the examples)."
    )


def _check_files(spec: Archive, folder: Path, fix: str) -> None:
    """Every record file present with exactly records x record size bytes; every name file present."""
    for name, records in {**spec.train, **spec.test}.items():
        path = folder / name
        expected = records * spec.record_bytes
        if not path.is_file():
            raise DatasetError(f"{path} is missing. {fix}")
        size = path.stat().st_size
        if size != expected:
            raise DatasetError(
                f"{path} is truncated or corrupted: {size} bytes, expected {expected} "
                f"({records} records of {spec.record_bytes} bytes). {fix}")
    for name, _ in spec.label_files:
        if not (folder / name).is_file():
            raise DatasetError(f"{folder / name} is missing. {fix}")


# --------------------------------------------------------------------------- read it
def _read_split(spec: Archive, folder: Path, train: bool):
    """(labels (N, number of label bytes) int64, images (N, 3, 32, 32) uint8) of one split."""
    files = spec.train if train else spec.test
    records = np.concatenate([
        np.fromfile(folder / name, dtype=np.uint8).reshape(count, spec.record_bytes)
        for name, count in files.items()
    ])
    k = len(spec.label_files)
    labels = records[:, :k].astype(np.int64)
    images = records[:, k:].reshape(-1, 3, 32, 32)  # copies the pixels out of the records
    for j, (name, num_classes) in enumerate(spec.label_files):
        if labels[:, j].max(initial=0) >= num_classes:
            raise DatasetError(
                f"{folder}: a record holds label {labels[:, j].max()} but {name} names only "
                f"{num_classes} classes; the data is corrupted. Delete the folder and {FETCH_AGAIN}.")
    return labels, images


def _read_names(path: Path, num_classes: int) -> tuple:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise DatasetError(f"{path}, line {line}: not UTF-8 text (byte {raw[err.start]:#04x}); the file is "
                           f"corrupted. Delete its folder and {FETCH_AGAIN}.") from None
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(names) != num_classes:
        raise DatasetError(
            f"{path} names {len(names)} classes, expected {num_classes}; the file is corrupted. "
            f"Delete its folder and {FETCH_AGAIN}.")
    return names


class _CIFAR(ImageDataset):
    """Shared by CIFAR10 and CIFAR100: find or fetch the files, read one split, name the labels."""

    key = None                   # entry of ARCHIVES
    MEAN = STD = None

    def __init__(self, root=None, train=True, download=True, progress=True):
        spec = ARCHIVES[self.key]
        self.root = prepare(spec, root, download, progress, check=_check_files, advice=_how_to_fix)
        self.train = train
        label_bytes, images = _read_split(spec, self.root, train)
        names = [_read_names(self.root / f, k) for f, k in spec.label_files]
        labels, classes = self._choose_labels(label_bytes, names)
        super().__init__(images, labels, classes, self.MEAN, self.STD)

    def _choose_labels(self, label_bytes, names):
        raise NotImplementedError

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"{type(self).__name__}({split}, {len(self)} images, {self.num_classes} classes)"


class CIFAR10(_CIFAR):
    """CIFAR-10: 50,000 training or 10,000 test images (3, 32, 32) uint8 in 10 classes.

    ``CIFAR10(root=None, train=True, download=True, progress=True)``; attributes ``images``,
    ``labels`` (int64), ``classes`` (airplane, automobile, ...), ``mean``/``std`` (per-channel,
    for ``Normalize``), ``root`` (the folder the files were read from).
    """

    key = "cifar10"
    MEAN, STD = CIFAR10_MEAN, CIFAR10_STD

    def _choose_labels(self, label_bytes, names):
        return label_bytes[:, 0].copy(), names[0]


class CIFAR100(_CIFAR):
    """CIFAR-100: like CIFAR10, with 100 fine classes grouped into 20 coarse ones.

    ``label_mode`` ("fine" or "coarse") picks what ``labels`` and ``classes`` are; both are
    always available as ``fine_labels``/``fine_classes`` and ``coarse_labels``/``coarse_classes``.
    """

    key = "cifar100"
    MEAN, STD = CIFAR100_MEAN, CIFAR100_STD

    def __init__(self, root=None, train=True, download=True, label_mode="fine", progress=True):
        if label_mode not in ("fine", "coarse"):
            raise ValueError(f"label_mode must be 'fine' or 'coarse', got {label_mode!r}")
        self.label_mode = label_mode
        super().__init__(root, train, download, progress)

    def _choose_labels(self, label_bytes, names):
        self.coarse_labels, self.fine_labels = label_bytes[:, 0].copy(), label_bytes[:, 1].copy()
        self.coarse_classes, self.fine_classes = names
        if self.label_mode == "fine":
            return self.fine_labels, self.fine_classes
        return self.coarse_labels, self.coarse_classes
