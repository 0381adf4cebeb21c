"""CIFAR-10 and CIFAR-100 from the official binary archives: download, verify, unpack, read.

The binary archives hold fixed-size records, read here with NumPy alone (no pickle):

- CIFAR-10 (``cifar-10-binary.tar.gz`` -> ``cifar-10-batches-bin/``): ``data_batch_1.bin`` ..
  ``data_batch_5.bin`` (train) and ``test_batch.bin``, 10,000 records each; a record is
  1 label byte + 3,072 pixel bytes. Label names: ``batches.meta.txt``, one per line.
- CIFAR-100 (``cifar-100-binary.tar.gz`` -> ``cifar-100-binary/``): ``train.bin`` (50,000)
  and ``test.bin`` (10,000); a record is 1 coarse label byte, 1 fine label byte, 3,072 pixel
  bytes. Label names: ``coarse_label_names.txt`` (20) and ``fine_label_names.txt`` (100).

The 3,072 pixel bytes are the red, then green, then blue 32 x 32 plane, each row-major, so
``pixels.reshape(-1, 3, 32, 32)`` is NCHW as it stands.

Where the data lives: the ``root`` argument (``--data-dir`` in the examples), else the
``TINYMLP_DATA`` variable, else ``$XDG_CACHE_HOME/tinymlp``, else ``~/.cache/tinymlp``.
A folder that already holds the extracted files, complete (every record file of exactly the
right size), is used as it is, without the network. Otherwise the archive is downloaded (a
tqdm progress bar) to a temporary file beside its final name, its MD5 is checked, and only
then is it renamed into place; it is unpacked with tarfile's ``filter="data"`` (no member may
write outside the folder) into a temporary folder that is renamed into place once its
contents are checked. An interrupted or refused step therefore leaves nothing half-written.

Bounds: an archive with more than ``max_members`` members, or whose members would unpack to
more than ``max_unpacked`` bytes, is refused before anything is written (a crafted archive; the
official ones hold a few files and about 180 MB); a download, or an archive found in the folder,
larger than ``max_size`` bytes (set where no MD5 is pinned) is refused too. A data folder that is
a file, cannot be created or cannot be written to is named in one sentence.

``ARCHIVES`` describes each archive (URLs tried in order, MD5, record counts); replace an
entry to use a mirror, e.g. ``ARCHIVES["cifar10"] = dataclasses.replace(ARCHIVES["cifar10"],
urls=("https://mirror.example/cifar-10-binary.tar.gz",))``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import tarfile
import tempfile
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .loader import ImageDataset

__all__ = [
    "ARCHIVES", "CIFAR10", "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100", "CIFAR100_MEAN",
    "CIFAR100_STD", "Archive", "DatasetError", "data_root", "prepare",
]

# Per-channel mean and standard deviation of the training pixels on the [0, 1] scale.
# (The often copied C10 std (0.2023, 0.1994, 0.2010) is not the per-channel pixel std.)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN = (0.5071, 0.4867, 0.4408)
CIFAR100_STD = (0.2675, 0.2565, 0.2761)

IMAGE_BYTES = 3 * 32 * 32
_CHUNK = 1 << 20
MAX_MEMBERS = 1000            # the defaults of Archive.max_members / max_unpacked
MAX_UNPACKED = 1 << 30        # bytes


class DatasetError(RuntimeError):
    """Data that cannot be had: missing offline, a failed download, a corrupted file."""


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


# --------------------------------------------------------------------------- where
def data_root(root=None) -> Path:
    """The data folder: ``root``, else $TINYMLP_DATA, else $XDG_CACHE_HOME/tinymlp, else
    ~/.cache/tinymlp (empty variables count as unset)."""
    if root is not None:
        return Path(root).expanduser()
    if os.environ.get("TINYMLP_DATA"):
        return Path(os.environ["TINYMLP_DATA"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "tinymlp"
    return Path.home() / ".cache" / "tinymlp"


def _how_to_fix(spec: Archive, root: Path) -> str:
    return (
        f"To use a copy you already have, pass its folder (the one holding {spec.folder}/ or "
        f"{spec.filename}) as root=... (--data-dir in the examples) or set TINYMLP_DATA; it is "
        f"looked for in {root}. To work without it, use the generated set: "
        f"tinymlp.data.SyntheticImages (--dataset synthetic in the examples)."
    )


# --------------------------------------------------------------------------- get it
def prepare(spec: Archive, root=None, download=True, progress=True, *, check=None, advice=None) -> Path:
    """Make sure ``root/spec.folder`` holds the complete extracted archive; return that folder.

    Uses the extracted folder if it is there (no network), else unpacks ``spec.filename``
    from ``root`` if it is there, else downloads it (when ``download``). Other data sets reuse
    these steps with their own archive description (``name``, ``urls``, ``filename``, ``md5``
    (None: not pinned), ``size``, ``folder``, ``kind``), ``check(spec, folder, fix)`` (raise a
    DatasetError on incomplete files; default: the CIFAR record sizes) and ``advice(spec,
    root)`` (what to do without the network).
    """
    check, advice = check or _check_files, advice or _how_to_fix
    root = data_root(root)
    folder = root / spec.folder
    if root.exists() and not root.is_dir():
        raise DatasetError(f"the data folder {root} is a file, not a folder: pass a folder as root=... "
                           f"(--data-dir in the examples) or in TINYMLP_DATA.")
    if folder.exists() and not folder.is_dir():
        raise DatasetError(f"{folder} is a file where the unpacked {spec.name} folder belongs: move or delete "
                           f"it and run again.")
    if folder.is_dir():
        check(spec, folder, f"Delete the folder {folder} and run again with "
                            f"download=True to fetch and unpack a fresh copy.")
        return folder
    archive = root / spec.filename
    downloaded = False
    if archive.is_file():
        limit = getattr(spec, "max_size", None)
        if limit is not None and (size := archive.stat().st_size) > limit:
            raise DatasetError(
                f"{archive} was refused: it is {size:,} bytes, more than the {limit:,} that {spec.name} can "
                f"be (it is not the official archive); delete it and run again with download=True.")
        actual = _md5(archive)
        if spec.md5 is not None and actual != spec.md5:
            raise DatasetError(
                f"{archive} is corrupted or incomplete: its MD5 is {actual}, expected {spec.md5}. "
                f"Delete it and run again with download=True to fetch a fresh copy.")
    elif not download:
        raise DatasetError(
            f"{spec.name} was not found in {root} and download=False. Pass download=True (in the "
            f"example scripts: leave out --no-download) to fetch it. " + advice(spec, root))
    else:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(_unwritable(root, exc, "create")) from None
        _download(spec, archive, progress, advice)
        downloaded = True
    _extract(spec, archive, root, downloaded, check)
    return folder


def _unwritable(root: Path, exc: OSError, action="write in") -> str:
    return (f"cannot {action} the data folder {root} ({exc.strerror or exc}): make it writable, or pass "
            f"another folder as root=... (--data-dir in the examples) or in TINYMLP_DATA.")


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _ChecksumError(Exception):
    pass


def _download(spec: Archive, dest: Path, progress: bool, advice) -> None:
    """Fetch ``spec`` from the first of its URLs that works; verify the MD5; rename into place."""
    failures, checksum_failed = [], False
    for url in spec.urls:
        try:
            _fetch(url, dest, spec, progress)
            return
        except _ChecksumError as exc:
            checksum_failed = True
            failures.append(f"{url}: {exc}")
        except (OSError, ValueError, http.client.HTTPException) as exc:  # URLError is an OSError
            failures.append(f"{url}: {type(exc).__name__}: {exc}")
    reasons = "\n  ".join(failures)
    if checksum_failed:
        raise DatasetError(f"downloading {spec.name} failed; nothing was kept:\n  {reasons}")
    raise DatasetError(
        f"could not download {spec.name} (no network?):\n  {reasons}\n"
        + advice(spec, dest.parent))


def _fetch(url: str, dest: Path, spec: Archive, progress: bool) -> None:
    from tqdm import tqdm  # noqa: PLC0415 - only a download needs it

    try:
        fd, part = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as exc:
        raise DatasetError(_unwritable(dest.parent, exc)) from None
    limit = getattr(spec, "max_size", None)
    try:
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            announced = int(response.headers.get("Content-Length") or 0)
            total = announced or spec.size or None
            received = 0
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                      desc=spec.filename, disable=not progress) as bar:
                while chunk := response.read(_CHUNK):
                    received += len(chunk)
                    if limit is not None and max(received, announced) > limit:
                        raise DatasetError(
                            f"downloading {spec.name} from {url} was stopped: it is larger than {limit:,} bytes, "
                            f"more than the archive can be (the server sent something else); nothing was kept.")
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        actual = digest.hexdigest()
        if spec.md5 is not None and actual != spec.md5:
            raise _ChecksumError(
                f"MD5 mismatch: expected {spec.md5}, got {actual} (a truncated or altered "
                f"download); the file was removed")
        os.replace(part, dest)
    finally:
        if os.path.exists(part):
            os.remove(part)


def _extract(spec: Archive, archive: Path, root: Path, remove_on_failure: bool, check) -> None:
    """Unpack ``archive`` into a temporary folder in ``root``, check it, rename it into place.

    On failure nothing is left of the unpacking, and a freshly downloaded archive is removed.
    """
    if not hasattr(tarfile, "data_filter"):
        raise DatasetError("unpacking safely needs tarfile's extraction filters (Python >= 3.11.4)")
    fix = ("The downloaded archive was removed." if remove_on_failure else
           "Delete it and run again with download=True to fetch a fresh copy.")
    try:
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{spec.folder}.", suffix=".unpacking"))
    except OSError as exc:
        raise DatasetError(f"cannot unpack {archive}: " + _unwritable(root, exc)) from None
    try:
        try:
            if spec.kind == "zip":
                _extract_zip(spec, archive, tmp, fix)
            else:
                with tarfile.open(archive, "r:gz") as tar:
                    members = _bounded(spec, archive, ((m, m.size) for m in tar), fix)
                    tar.extractall(tmp, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise DatasetError(
                f"{archive} was refused: member {exc.tarinfo.name!r} would be written outside "
                f"the data folder or is not a plain file ({type(exc).__name__}). Nothing was "
                f"extracted. This is not the official archive. {fix}") from None
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
            raise DatasetError(
                f"{archive} could not be unpacked ({type(exc).__name__}: {exc}): it is truncated "
                f"or corrupted. Nothing was extracted. {fix}") from None
        check(spec, tmp / spec.folder, f"{archive} is not the expected archive. {fix}")
        try:
            os.rename(tmp / spec.folder, root / spec.folder)
        except OSError:
            if not (root / spec.folder).is_dir():
                raise  # else another process unpacked it meanwhile: keep theirs
    except DatasetError:
        if remove_on_failure:
            archive.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _bounded(spec, archive: Path, members, fix: str) -> list:
    """The ``(member, size)`` pairs' members, after refusing too many of them or too many bytes in all
    (counted from the headers, before anything is written)."""
    max_members = getattr(spec, "max_members", MAX_MEMBERS)
    max_unpacked = getattr(spec, "max_unpacked", MAX_UNPACKED)
    kept, total = [], 0
    for member, size in members:
        kept.append(member)
        total += max(int(size), 0)
        if len(kept) > max_members:
            raise DatasetError(f"{archive} was refused: it holds more than {max_members:,} members, which "
                               f"{spec.name} does not (a crafted archive); nothing was extracted. {fix}")
        if total > max_unpacked:
            raise DatasetError(f"{archive} was refused: its members would unpack to more than {max_unpacked:,} "
                               f"bytes, which {spec.name} does not (a crafted archive); nothing was extracted. {fix}")
    return kept


def _extract_zip(spec, archive: Path, tmp: Path, fix: str) -> None:
    """A zip has no extraction filter: refuse it whole if any member would land outside ``tmp``,
    or if it holds too many members or bytes; copy each member counting the bytes actually
    unpacked (a member may hold more than its header says)."""
    with zipfile.ZipFile(archive) as zf:
        infos = _bounded(spec, archive, ((i, i.file_size) for i in zf.infolist()), fix)
        for info in infos:
            if not (tmp / info.filename).resolve().is_relative_to(tmp.resolve()):
                raise DatasetError(f"{archive} was refused: member {info.filename!r} would be written outside "
                                   f"the data folder. Nothing was extracted. {fix}")
        max_unpacked, written = getattr(spec, "max_unpacked", MAX_UNPACKED), 0
        for info in infos:
            dest = tmp / info.filename
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                while chunk := src.read(_CHUNK):
                    written += len(chunk)
                    if written > max_unpacked:
                        raise DatasetError(f"{archive} was refused: it unpacks to more than {max_unpacked:,} bytes, "
                                           f"more than its headers say (a crafted archive); nothing was kept. {fix}")
                    out.write(chunk)


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
                f"{num_classes} classes; the data is corrupted. Delete the folder and run "
                f"again with download=True.")
    return labels, images


def _read_names(path: Path, num_classes: int) -> tuple:
    names = tuple(line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    if len(names) != num_classes:
        raise DatasetError(
            f"{path} names {len(names)} classes, expected {num_classes}; the file is corrupted. "
            f"Delete its folder and run again with download=True.")
    return names


class _CIFAR(ImageDataset):
    """Shared by CIFAR10 and CIFAR100: find or fetch the files, read one split, name the labels."""

    key = None                   # entry of ARCHIVES
    MEAN = STD = None

    def __init__(self, root=None, train=True, download=True, progress=True):
        spec = ARCHIVES[self.key]
        self.root = prepare(spec, root, download, progress)
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
