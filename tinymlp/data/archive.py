"""Where data sets live and how an archive gets there: download, checksum, bounded unpacking.

    folder = prepare(spec, root, download=True, check=check_files, advice=offline_advice)

``spec`` describes one archive (CIFAR's ``Archive``, the text sets' ``TextArchive``): ``name``,
``urls`` (tried in order), ``filename``, ``md5`` (None: not pinned), ``size`` (bytes, for the
progress bar), ``folder`` (what the archive unpacks to), ``kind`` ("tar.gz" or "zip") and,
optionally, the bounds ``max_members``, ``max_unpacked`` and ``max_size``. ``check(spec,
folder, fix)`` raises a DatasetError when the unpacked files are incomplete; ``advice(spec,
root)`` says what to do without the network.

Where the data lives: the ``root`` argument (``--data-dir`` in the examples), else the
``TINYMLP_DATA`` variable, else ``$XDG_CACHE_HOME/tinymlp``, else ``~/.cache/tinymlp``.
A folder that already holds the extracted files, complete (``check`` passes), is used as it is,
without the network. Otherwise the archive is downloaded (a tqdm progress bar) to a temporary
file beside its final name (``tinymlp.files.temporary_file``), its MD5 is checked, and only then
is it renamed into place; it is unpacked with tarfile's ``filter="data"`` (no member may write
outside the folder) into a temporary folder that is renamed into place once its contents are
checked. An interrupted or refused step therefore leaves nothing half-written.

Bounds: an archive with more than ``max_members`` members, or whose members would unpack to
more than ``max_unpacked`` bytes, is refused before anything is written (a crafted archive; the
official ones hold a few files and about 180 MB); a download, or an archive found in the folder,
larger than ``max_size`` bytes (set where no MD5 is pinned) is refused too. A data folder that is
a file, cannot be created or cannot be written to is named in one sentence; one created for a
download that fails is removed again (a mistyped ``--data-dir`` is not left behind, empty).
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import shutil
import tarfile
import urllib.request
import zipfile
import zlib
from pathlib import Path

from ..files import temporary_file, temporary_folder

__all__ = ["FETCH_AGAIN", "MAX_MEMBERS", "MAX_UNPACKED", "DatasetError", "data_root", "prepare"]

# what to do about a damaged copy, for a command-line user and a Python user alike
FETCH_AGAIN = ("run again to fetch a fresh copy (the example scripts download it unless --no-download is "
               "given; in Python: download=True)")

_CHUNK = 1 << 20
MAX_MEMBERS = 1000            # the default bounds of an archive description (max_members / max_unpacked)
MAX_UNPACKED = 1 << 30        # bytes


class DatasetError(RuntimeError):
    """Data that cannot be had: missing offline, a failed download, a corrupted file."""


# --------------------------------------------------------------------------- where the data lives
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


# --------------------------------------------------------------------------- getting an archive
def prepare(spec, root=None, download=True, progress=True, *, check, advice) -> Path:
    """Make sure ``root/spec.folder`` holds the complete extracted archive; return that folder.

    Uses the extracted folder if it is there (no network), else unpacks ``spec.filename``
    from ``root`` if it is there, else downloads it (when ``download``). ``check(spec, folder,
    fix)`` raises a DatasetError on incomplete files (``fix`` says what to do about them);
    ``advice(spec, root)`` is what to do without the network.
    """
    root = data_root(root)
    folder = root / spec.folder
    if root.exists() and not root.is_dir():
        raise DatasetError(f"the data folder {root} is a file, not a folder: pass a folder as root=... "
                           f"(--data-dir in the examples) or in TINYMLP_DATA.")
    if folder.exists() and not folder.is_dir():
        raise DatasetError(f"{folder} is a file where the unpacked {spec.name} folder belongs: move or delete "
                           f"it and run again.")
    if folder.is_dir():
        check(spec, folder, f"Delete the folder {folder} and {FETCH_AGAIN}.")
        return folder
    archive = root / spec.filename
    if archive.is_file():
        limit = getattr(spec, "max_size", None)
        if limit is not None and (size := archive.stat().st_size) > limit:
            raise DatasetError(
                f"{archive} was refused: it is {size:,} bytes, more than the {limit:,} that {spec.name} can "
                f"be (it is not the official archive); delete it and {FETCH_AGAIN}.")
        actual = _md5(archive)
        if spec.md5 is not None and actual != spec.md5:
            raise DatasetError(
                f"{archive} is corrupted or incomplete: its MD5 is {actual}, expected {spec.md5}. "
                f"Delete it and {FETCH_AGAIN}.")
    elif not download:
        raise DatasetError(
            f"{spec.name} was not found in {root} and download=False. Pass download=True (in the "
            f"example scripts: leave out --no-download) to fetch it. " + advice(spec, root))
    else:
        created = _missing_folders(root)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(_unwritable(root, exc, "create")) from None
        try:
            _download(spec, archive, progress, advice)
            _extract(spec, archive, root, True, check)
        except BaseException:
            _remove_empty(created)      # a mistyped root is not left behind, created and empty
            raise
        return folder
    _extract(spec, archive, root, False, check)      # an archive found in root
    return folder


def _missing_folders(root: Path) -> list:
    """``root`` and those of its parents that do not exist yet, deepest first."""
    missing, folder = [], root.absolute()
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_empty(folders) -> None:
    """Remove the ``folders`` (deepest first) that are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


def _unwritable(root: Path, exc: OSError, action="write in") -> str:
    return (f"cannot {action} the data folder {root} ({exc.strerror or exc}): make it writable, or pass "
            f"another folder as root=... (--data-dir in the examples) or in TINYMLP_DATA.")


DISK_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def _full_disk(folder: Path) -> str:
    return (f"Free some space in {folder} (or raise the file-size limit, ulimit -f), or pass another folder as "
            "root=... (--data-dir in the examples) or in TINYMLP_DATA.")


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class _ChecksumError(Exception):
    pass


def _download(spec, dest: Path, progress: bool, advice) -> None:
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


def _fetch(url: str, dest: Path, spec, progress: bool) -> None:
    from tqdm import tqdm  # noqa: PLC0415 - only a download needs it

    try:
        fd, part = temporary_file(dest, suffix=".part")
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
                    try:
                        out.write(chunk)
                    except OSError as exc:
                        raise DatasetError(f"downloading {spec.name}: writing {dest} failed: {exc.strerror or exc}; "
                                           f"nothing was kept. {_full_disk(dest.parent)}") from None
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


def _extract(spec, archive: Path, root: Path, remove_on_failure: bool, check) -> None:
    """Unpack ``archive`` into a temporary folder in ``root``, check it, rename it into place.

    On failure nothing is left of the unpacking, and a freshly downloaded archive is removed.
    """
    if not hasattr(tarfile, "data_filter"):
        raise DatasetError("unpacking safely needs tarfile's extraction filters (Python >= 3.11.4)")
    fix = ("The downloaded archive was removed." if remove_on_failure else f"Delete it and {FETCH_AGAIN}.")
    try:
        tmp = Path(temporary_folder(root / spec.folder, suffix=".unpacking"))
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
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise DatasetError(f"{archive} could not be unpacked ({type(exc).__name__}: {exc}): it is truncated "
                                   f"or corrupted. Nothing was extracted. {fix}") from None
            raise DatasetError(f"unpacking {archive} into {root} failed: {exc.strerror}; nothing was extracted. "
                               f"{_full_disk(root)}" + ("" if not remove_on_failure else f" {fix}")) from None
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
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
