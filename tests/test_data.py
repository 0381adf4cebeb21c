"""tinymlp.data: CIFAR archives (download, checks, refusals), the synthetic set, the loader, transforms.

No test touches the network: tiny archives in the exact official binary format are written to
tmp_path and served from file:// URLs or from an HTTP server on 127.0.0.1, with ARCHIVES
patched to their URLs, MD5s and record counts.
"""

import dataclasses
import functools
import gzip
import hashlib
import http.server
import io
import tarfile
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from tinymlp.backend import to_device
from tinymlp.data import (
    ARCHIVES, CIFAR10, CIFAR10_MEAN, CIFAR10_STD, CIFAR100, CIFAR100_MEAN, CIFAR100_STD, Compose,
    CutMix, DataLoader, DatasetError, HorizontalFlip, Mixup, Normalize, RandomCrop,
    SyntheticImages, cutmix, data_root, get_dataset, horizontal_flip, mixup, normalize,
    random_crop,
)
from tinymlp.data.synthetic import arrangement_class

C10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


# --------------------------------------------------------------------------- tiny archives
def records(rng, n, class_counts):
    """n records in the official layout: one byte per label, then the R, G, B planes."""
    labels = np.stack([rng.integers(0, k, size=n) for k in class_counts], axis=1)
    pixels = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    raw = np.concatenate([labels.astype(np.uint8), pixels], axis=1).tobytes()
    return raw, labels, pixels


def write_tar(path, members, extra=()):
    """A .tar.gz with regular-file ``members`` (name -> bytes) and raw TarInfo ``extra`` members."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@dataclasses.dataclass
class Tiny:
    spec: object          # the patched Archive
    archive: object       # path of the .tar.gz
    splits: dict          # "train"/"test" -> (labels (n, k), pixels (n, 3072))
    names: tuple          # label names, one tuple per label byte


def make_tiny(tmp_path, key, extra=(), truncate=None):
    """Write a tiny archive for ARCHIVES[key] in tmp_path/serve; return what it holds."""
    spec = ARCHIVES[key]
    rng = np.random.default_rng(0 if key == "cifar10" else 1)
    if key == "cifar10":
        names = (C10_NAMES,)
        train, test = {f"data_batch_{i}.bin": 2 for i in range(1, 6)}, {"test_batch.bin": 3}
    else:
        names = (tuple(f"coarse_{i:02d}" for i in range(20)), tuple(f"fine_{i:03d}" for i in range(100)))
        train, test = {"train.bin": 7}, {"test.bin": 4}
    counts = [len(n) for n in names]
    members, splits = {}, {}
    for split, files in (("train", train), ("test", test)):
        parts = [records(rng, n, counts) for n in files.values()]
        for (name, _), (raw, _, _) in zip(files.items(), parts):
            members[f"{spec.folder}/{name}"] = raw
        splits[split] = (np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]))
    for (file, _), n in zip(spec.label_files, names):
        members[f"{spec.folder}/{file}"] = ("\n".join(n) + "\n\n").encode()  # blank tail, as shipped
    serve = tmp_path / "serve"
    serve.mkdir(exist_ok=True)
    archive = write_tar(serve / spec.filename, members, extra)
    if truncate is not None:
        archive.write_bytes(archive.read_bytes()[:truncate])
    md5 = hashlib.md5(archive.read_bytes()).hexdigest()
    spec = dataclasses.replace(spec, urls=(archive.as_uri(),), md5=md5, size=archive.stat().st_size,
                               train=train, test=test)
    return Tiny(spec, archive, splits, names)


def use(monkeypatch, key, spec, **changes):
    monkeypatch.setitem(ARCHIVES, key, dataclasses.replace(spec, **changes))


def tree(root):
    """Every path under root, relative, as strings (empty when nothing was left behind)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


@pytest.fixture
def http_url():
    """serve(folder) -> base URL of an HTTP server on 127.0.0.1 serving that folder."""
    servers = []

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    def serve(folder):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise urllib.error.URLError("network disabled by the test")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)


# --------------------------------------------------------------------------- CIFAR: loading
def check_split(ds, labels, pixels):
    n = len(labels)
    assert len(ds) == n and ds.images.shape == (n, 3, 32, 32) and ds.images.dtype == np.uint8
    assert ds.labels.dtype == np.int64
    np.testing.assert_array_equal(ds.labels, labels)
    # NCHW straight from the record: byte 0 = R(0,0), byte 1 = R(0,1), byte 32 = R(1,0),
    # byte 1024 = G(0,0), byte 2048 = B(0,0), byte 3071 = B(31,31)
    for j, (c, y, x) in [(0, (0, 0, 0)), (1, (0, 0, 1)), (32, (0, 1, 0)), (1024, (1, 0, 0)),
                         (2048, (2, 0, 0)), (3071, (2, 31, 31))]:
        np.testing.assert_array_equal(ds.images[:, c, y, x], pixels[:, j])
    image, label = ds[n - 1]
    assert image.shape == (3, 32, 32) and label == ds.labels[-1]


def test_cifar10_download_from_file_url(tmp_path, monkeypatch):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    train = CIFAR10(root=root, train=True, progress=False)
    labels, pixels = tiny.splits["train"]
    check_split(train, labels[:, 0], pixels)
    assert train.classes == C10_NAMES and train.num_classes == 10
    assert train.mean == CIFAR10_MEAN and train.std == CIFAR10_STD
    test = CIFAR10(root=root, train=False, progress=False)
    labels, pixels = tiny.splits["test"]
    check_split(test, labels[:, 0], pixels)
    # the archive is kept, the folder extracted, no temporary file or folder left behind
    folder = "cifar-10-batches-bin"
    files = [*tiny.spec.train, *tiny.spec.test, "batches.meta.txt"]
    assert tree(root) == sorted([folder, "cifar-10-binary.tar.gz"] + [f"{folder}/{f}" for f in files])


def test_cifar100_download_over_http(tmp_path, monkeypatch, http_url):
    tiny = make_tiny(tmp_path, "cifar100")
    base = http_url(tiny.archive.parent)
    use(monkeypatch, "cifar100", tiny.spec, urls=(f"{base}/missing.tar.gz", f"{base}/{tiny.archive.name}"))
    root = tmp_path / "data"
    fine = CIFAR100(root=root, train=True, progress=False)          # the first mirror 404s
    labels, pixels = tiny.splits["train"]
    check_split(fine, labels[:, 1], pixels)
    np.testing.assert_array_equal(fine.coarse_labels, labels[:, 0])
    assert fine.classes == fine.fine_classes == tiny.names[1] and fine.num_classes == 100
    assert fine.coarse_classes == tiny.names[0]
    assert fine.mean == CIFAR100_MEAN and fine.std == CIFAR100_STD
    coarse = CIFAR100(root=root, train=False, label_mode="coarse", progress=False)
    labels, pixels = tiny.splits["test"]
    check_split(coarse, labels[:, 0], pixels)
    assert coarse.classes == tiny.names[0] and coarse.num_classes == 20
    np.testing.assert_array_equal(coarse.fine_labels, labels[:, 1])
    with pytest.raises(ValueError, match="label_mode"):
        CIFAR100(root=root, label_mode="medium")


def test_extracted_copy_is_used_without_network(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with tarfile.open(tiny.archive) as tar:  # a copy the user unpacked by hand
        tar.extractall(root, filter="data")
    ds = CIFAR10(root=root, download=True)
    np.testing.assert_array_equal(ds.labels, tiny.splits["train"][0][:, 0])
    assert ds.root == root / "cifar-10-batches-bin"


def test_archive_already_in_folder_is_unpacked_without_network(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar100")
    monkeypatch.setitem(ARCHIVES, "cifar100", tiny.spec)
    root = tmp_path / "data"
    root.mkdir()
    (root / tiny.archive.name).write_bytes(tiny.archive.read_bytes())
    ds = CIFAR100(root=root, train=False, download=False)
    np.testing.assert_array_equal(ds.labels, tiny.splits["test"][0][:, 1])


def test_corrupted_archive_in_folder_is_refused_and_kept(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    root.mkdir()
    (root / tiny.archive.name).write_bytes(tiny.archive.read_bytes()[:-10])
    with pytest.raises(DatasetError, match="Delete it") as err:
        CIFAR10(root=root)
    assert tiny.spec.md5 in str(err.value) and "MD5" in str(err.value)
    assert tree(root) == [tiny.archive.name]  # the user's file is theirs to delete


def test_root_resolution_order(tmp_path, monkeypatch):
    for var in ("TINYMLP_DATA", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_root() == tmp_path / "home" / ".cache" / "tinymlp"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_root() == tmp_path / "xdg" / "tinymlp"
    monkeypatch.setenv("TINYMLP_DATA", str(tmp_path / "env"))
    assert data_root() == tmp_path / "env"
    assert data_root(tmp_path / "arg") == tmp_path / "arg"
    assert data_root("~/x") == tmp_path / "home" / "x"


def test_downloads_into_the_resolved_root(tmp_path, monkeypatch):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    monkeypatch.setenv("TINYMLP_DATA", str(tmp_path / "env"))
    ds = CIFAR10(train=False)  # with the progress bar
    assert ds.root == tmp_path / "env" / "cifar-10-batches-bin"


# --------------------------------------------------------------------------- CIFAR: refusals
def test_wrong_md5_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    tiny = make_tiny(tmp_path, "cifar10")
    use(monkeypatch, "cifar10", tiny.spec, md5="0123456789abcdef0123456789abcdef")
    root = tmp_path / "data"
    with pytest.raises(DatasetError) as err:
        CIFAR10(root=root, progress=False)
    message = str(err.value)
    assert "0123456789abcdef0123456789abcdef" in message and tiny.spec.md5 in message
    assert "MD5" in message
    assert tree(root) == []


def test_truncated_archive_is_refused(tmp_path, monkeypatch):
    full = make_tiny(tmp_path, "cifar10")
    size = full.archive.stat().st_size
    # with the right checksum a truncated download is a checksum mismatch ...
    full.archive.write_bytes(full.archive.read_bytes()[: size // 2])
    use(monkeypatch, "cifar10", full.spec)
    root = tmp_path / "data"
    with pytest.raises(DatasetError, match="MD5"):
        CIFAR10(root=root, progress=False)
    assert tree(root) == []
    # ... and an archive that matches its (wrong) checksum still fails to unpack, cleanly
    cut = make_tiny(tmp_path, "cifar10", truncate=size // 2)
    monkeypatch.setitem(ARCHIVES, "cifar10", cut.spec)
    with pytest.raises(DatasetError, match="truncated or corrupted") as err:
        CIFAR10(root=root, progress=False)
    assert "cifar-10-binary.tar.gz" in str(err.value) and "removed" in str(err.value)
    assert tree(root) == []


def test_archive_without_expected_files_is_refused(tmp_path, monkeypatch):
    tiny = make_tiny(tmp_path, "cifar10")
    use(monkeypatch, "cifar10", tiny.spec, test={"test_batch.bin": 3, "test_batch_2.bin": 3})
    root = tmp_path / "data"
    with pytest.raises(DatasetError, match="test_batch_2.bin is missing"):
        CIFAR10(root=root, progress=False)
    assert tree(root) == []


def hostile_members():
    escape = tarfile.TarInfo("cifar-10-batches-bin/../../escaped.txt")
    escape.size = 4
    link = tarfile.TarInfo("cifar-10-batches-bin/passwd")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return {"parent": [(escape, b"evil")], "symlink": [(link, None)]}


@pytest.mark.parametrize("kind", ["parent", "symlink"])
def test_path_traversal_member_is_refused(tmp_path, monkeypatch, kind):
    tiny = make_tiny(tmp_path, "cifar10", extra=hostile_members()[kind])
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data" / "cache"
    with pytest.raises(DatasetError, match="refused") as err:
        CIFAR10(root=root, progress=False)
    assert "outside" in str(err.value)
    assert tree(root) == []
    assert not (tmp_path / "data" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()


def test_an_archive_with_too_many_members_is_refused(tmp_path, monkeypatch):
    empty = [(tarfile.TarInfo(f"cifar-10-batches-bin/x{i}"), b"") for i in range(1001)]    # default bound: 1000
    tiny = make_tiny(tmp_path, "cifar10", extra=empty)
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with pytest.raises(DatasetError, match=r"cifar-10-binary\.tar\.gz was refused: it holds more than 1,000 "
                                           r"members, which CIFAR-10 does not \(a crafted archive\); "
                                           r"nothing was extracted"):
        CIFAR10(root=root, progress=False)
    assert tree(root) == []


def test_an_archive_that_unpacks_to_too_many_bytes_is_refused_before_writing(tmp_path, monkeypatch):
    bomb = tarfile.TarInfo("cifar-10-batches-bin/huge.bin")
    bomb.size = 2 << 30                                   # the header says 2 GiB; the data is not even there
    archive = tmp_path / "serve" / "cifar-10-binary.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(gzip.compress(bomb.tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024))
    spec = dataclasses.replace(ARCHIVES["cifar10"], urls=(archive.as_uri(),),
                               md5=hashlib.md5(archive.read_bytes()).hexdigest())
    monkeypatch.setitem(ARCHIVES, "cifar10", spec)
    root = tmp_path / "data"
    with pytest.raises(DatasetError, match=r"its members would unpack to more than 1,073,741,824 bytes"):
        CIFAR10(root=root, progress=False)
    assert tree(root) == []
    tiny = make_tiny(tmp_path, "cifar10")                 # the bound is the spec's: a real one over it
    use(monkeypatch, "cifar10", tiny.spec, max_unpacked=10_000)
    with pytest.raises(DatasetError, match=r"more than 10,000 bytes"):
        CIFAR10(root=root, progress=False)
    assert tree(root) == []


def test_a_data_path_that_is_a_file_is_named(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    data = tmp_path / "data.bin"
    data.write_bytes(b"not a folder")
    for download in (True, False):
        with pytest.raises(DatasetError, match=rf"the data folder {data} is a file, not a folder: pass a folder"):
            CIFAR10(root=data, download=download)
    with pytest.raises(DatasetError, match=rf"cannot create the data folder {data / 'cache'} \("):
        CIFAR10(root=data / "cache")
    root = tmp_path / "root"
    root.mkdir()
    (root / "cifar-10-batches-bin").write_text("oops")
    with pytest.raises(DatasetError,
                       match=r"cifar-10-batches-bin is a file where the unpacked CIFAR-10 folder belongs"):
        CIFAR10(root=root)
    assert data.read_bytes() == b"not a folder" and tree(root) == ["cifar-10-batches-bin"]


def test_a_read_only_data_folder_is_named_not_blamed_on_the_network(tmp_path, monkeypatch):
    # CI runs as root, who may write anywhere: the folder's refusal is simulated where the OS gives it
    from tinymlp import files    # the temporaries of a download are named there

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setattr(files.tempfile, "mkstemp", denied)
    with pytest.raises(DatasetError, match=rf"^cannot write in the data folder {root} \(Permission denied\): "
                                           r"make it writable, or pass another folder") as err:
        CIFAR10(root=root, progress=False)
    assert "network" not in str(err.value) and tree(root) == []
    (root / tiny.spec.filename).write_bytes(tiny.archive.read_bytes())     # the archive is there: unpacking
    monkeypatch.setattr(files.tempfile, "mkdtemp", denied)
    with pytest.raises(DatasetError,
                       match=rf"cannot unpack {root / tiny.spec.filename}: cannot write in the data folder"):
        CIFAR10(root=root, progress=False)
    assert tree(root) == [tiny.spec.filename]


def test_truncated_record_file_is_named(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with tarfile.open(tiny.archive) as tar:
        tar.extractall(root, filter="data")
    batch = root / "cifar-10-batches-bin" / "data_batch_3.bin"
    batch.write_bytes(batch.read_bytes()[:-100])
    with pytest.raises(DatasetError) as err:
        CIFAR10(root=root)
    message = str(err.value)
    assert "data_batch_3.bin" in message and "truncated" in message
    assert "Delete the folder" in message and "download=True" in message and "--no-download" in message


def test_label_out_of_range_is_refused(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with tarfile.open(tiny.archive) as tar:
        tar.extractall(root, filter="data")
    batch = root / "cifar-10-batches-bin" / "test_batch.bin"
    raw = bytearray(batch.read_bytes())
    raw[3073] = 17  # the label byte of the second record
    batch.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="label 17"):
        CIFAR10(root=root, train=False)


def test_offline_without_data_says_what_to_do(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with pytest.raises(DatasetError) as err:
        CIFAR10(root=root)
    message = str(err.value)
    assert "network disabled" in message and "--data-dir" in message and "--dataset synthetic" in message
    assert "TINYMLP_DATA" in message and not root.exists()       # a mistyped --data-dir is not created
    with pytest.raises(DatasetError, match="download=True"):
        CIFAR100(root=root, download=False)


def test_official_archive_facts():
    c10, c100 = ARCHIVES["cifar10"], ARCHIVES["cifar100"]
    assert c10.md5 == "c32a1d4ab5d03f1284b67883e8d87530"
    assert c100.md5 == "03b5dce01913d631647c71ecec9e9cb8"
    assert c10.urls[0].endswith("/cifar-10-binary.tar.gz") and c10.folder == "cifar-10-batches-bin"
    assert c100.urls[0].endswith("/cifar-100-binary.tar.gz") and c100.folder == "cifar-100-binary"
    assert sum(c10.train.values()) == sum(c100.train.values()) == 50_000
    assert sum(c10.test.values()) == sum(c100.test.values()) == 10_000
    assert (c10.record_bytes, c100.record_bytes) == (3073, 3074)


def test_get_dataset(tmp_path):
    ds = get_dataset("synthetic", train=False, num_images=20, seed=3)
    assert isinstance(ds, SyntheticImages) and len(ds) == 20 and not ds.train
    with pytest.raises(ValueError, match="unknown dataset"):
        get_dataset("mnist")


# --------------------------------------------------------------------------- synthetic set
def test_synthetic_is_deterministic_and_balanced():
    a, b = SyntheticImages(200, seed=1), SyntheticImages(200, seed=1)
    np.testing.assert_array_equal(a.images, b.images)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.images.shape == (200, 3, 32, 32) and a.images.dtype == np.uint8
    assert a.labels.dtype == np.int64 and len(a.classes) == 10
    np.testing.assert_array_equal(np.bincount(a.labels, minlength=10), np.full(10, 20))
    other, test = SyntheticImages(200, seed=2), SyntheticImages(200, seed=1, train=False)
    assert not np.array_equal(a.images, other.images)
    assert not np.array_equal(a.images, test.images)


def test_synthetic_class_is_the_arrangement_of_the_markers():
    ds = SyntheticImages(300, seed=0)
    (row_a, col_a), (row_b, col_b) = np.divmod(ds.markers[:, 0], 4), np.divmod(ds.markers[:, 1], 4)
    for i in range(len(ds)):
        name = ds.classes[ds.labels[i]]
        dc = col_b[i] - col_a[i]
        side = ("far left" if dc <= -2 else "left" if dc == -1 else "same column" if dc == 0
                else "right" if dc == 1 else "far right")
        assert row_a[i] != row_b[i]
        assert name == f"B {side} of A, {'below' if row_b[i] > row_a[i] else 'above'}"
    np.testing.assert_array_equal(arrangement_class(ds.markers[:, 0], ds.markers[:, 1]), ds.labels)
    # the markers are drawn where it says: A's cross has its horizontal bar on rows 3-4 of
    # its 8 x 8 cell, B's hollow square its top edge on rows 0-1; both in their marker colour
    for i in range(len(ds)):
        for cell, rows, colour in ((ds.markers[i, 0], slice(3, 5), (0.85, 0.15, 0.15)),
                                   (ds.markers[i, 1], slice(0, 2), (0.15, 0.35, 0.90))):
            y, x = divmod(int(cell), 4)
            bar = ds.images[i, :, 8 * y:8 * y + 8, 8 * x:8 * x + 8][:, rows].reshape(3, -1)
            np.testing.assert_allclose(bar.mean(axis=1) / 255, colour, atol=0.1 + 0.1)  # jitter + noise


def test_synthetic_colour_statistics_do_not_depend_on_the_class():
    """Per-channel mean colours of the classes agree within noise: the class is in the layout."""
    ds = SyntheticImages(2000, seed=0)
    means = np.stack([ds.images[ds.labels == k].mean(axis=(0, 2, 3)) for k in range(10)])
    assert np.ptp(means, axis=0).max() < 4  # of 255


# --------------------------------------------------------------------------- loader
def batches(loader):
    return [(x.numpy(), y.numpy()) for x, y in loader]


def test_loader_batches_and_length():
    ds = SyntheticImages(50, seed=0)
    loader = DataLoader(ds, batch_size=16)
    out = batches(loader)
    assert len(loader) == len(out) == 4 and [len(y) for _, y in out] == [16, 16, 16, 2]
    x, y = out[0]
    assert x.dtype == np.float32 and x.shape == (16, 3, 32, 32) and y.dtype == np.int64
    np.testing.assert_allclose(x, ds.images[:16] / 255, atol=1e-6)  # no shuffle: dataset order
    np.testing.assert_array_equal(np.concatenate([y for _, y in out]), ds.labels)
    dropped = DataLoader(ds, batch_size=16, drop_last=True)
    assert len(dropped) == 3 and [len(y) for _, y in batches(dropped)] == [16, 16, 16]
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(ds, batch_size=0)


def test_loader_is_deterministic_given_a_seed():
    ds = SyntheticImages(40, seed=0)
    augment = Compose([RandomCrop(4), HorizontalFlip(), Normalize(ds.mean, ds.std)])

    def two_epochs(rng):
        loader = DataLoader(ds, 8, shuffle=True, rng=rng, transform=augment)
        return batches(loader) + batches(loader)

    first, again, other = two_epochs(7), two_epochs(np.random.default_rng(7)), two_epochs(8)
    for (x1, y1), (x2, y2) in zip(first, again):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(first, other))
    # each epoch is a permutation of the whole set, and the two epochs differ
    epoch1, epoch2 = np.concatenate([y for _, y in first[:5]]), np.concatenate([y for _, y in first[5:]])
    np.testing.assert_array_equal(np.sort(epoch1), np.sort(ds.labels))
    np.testing.assert_array_equal(np.sort(epoch2), np.sort(ds.labels))
    assert not np.array_equal(epoch1, epoch2) and not np.array_equal(first[0][0], first[5][0])


def test_loader_accepts_any_indexable_dataset():
    ds = SyntheticImages(10, seed=0)
    pairs = [ds[i] for i in range(10)]
    x, y = next(iter(DataLoader(pairs, 4)))
    np.testing.assert_allclose(x.numpy(), ds.images[:4] / 255, atol=1e-6)
    np.testing.assert_array_equal(y.numpy(), ds.labels[:4])


def test_loader_on_device(device):
    ds = SyntheticImages(20, seed=0)
    loader = DataLoader(ds, 8, shuffle=True, rng=0, transform=Normalize(ds.mean, ds.std), device=device)
    x, y = next(iter(loader))
    assert x.device == device and y.device == device and x.dtype == np.float32
    ref = next(iter(DataLoader(ds, 8, shuffle=True, rng=0, transform=Normalize(ds.mean, ds.std))))
    np.testing.assert_allclose(x.numpy(), ref[0].numpy(), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- transforms
def shifted(image, dy, dx):
    """Reference: the image moved by (dy, dx) with zeros coming in (pad then slice)."""
    _, h, w = image.shape
    padded = np.pad(image, ((0, 0), (4, 4), (4, 4)))
    return padded[:, 4 - dy:4 - dy + h, 4 - dx:4 - dx + w]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint8])
def test_random_crop_shifts_with_zero_padding(device, dtype):
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, size=(24, 3, 32, 32)).astype(dtype)  # no zeros inside images
    out = to_device(random_crop(to_device(images, device), 4, np.random.default_rng(1)), "cpu")
    assert out.shape == images.shape and out.dtype == images.dtype
    shifts = []
    for image, cropped in zip(images, out):
        found = [(dy, dx) for dy in range(-4, 5) for dx in range(-4, 5)
                 if np.array_equal(cropped, shifted(image, dy, dx))]
        assert len(found) == 1
        shifts.append(found[0])
    assert len(set(shifts)) > 5 and any(s != (0, 0) for s in shifts)
    assert random_crop(images, 0, rng) is images


def test_horizontal_flip(device):
    images = np.random.default_rng(0).random((32, 3, 8, 8), dtype=np.float32)
    x = to_device(images, device)
    flipped = to_device(horizontal_flip(x, np.random.default_rng(0)), "cpu")
    assert flipped.shape == images.shape and flipped.dtype == images.dtype
    was_flipped = [np.array_equal(f, i[..., ::-1]) for f, i in zip(flipped, images)]
    kept = [np.array_equal(f, i) for f, i in zip(flipped, images)]
    assert all(a != b for a, b in zip(was_flipped, kept)) and 0 < sum(was_flipped) < 32
    np.testing.assert_array_equal(to_device(horizontal_flip(x, np.random.default_rng(0), p=1.0), "cpu"),
                                  images[..., ::-1])
    np.testing.assert_array_equal(to_device(horizontal_flip(x, np.random.default_rng(0), p=0.0), "cpu"),
                                  images)


def test_normalisation_constants():
    assert CIFAR10_MEAN == (0.4914, 0.4822, 0.4465) and CIFAR10_STD == (0.2470, 0.2435, 0.2616)
    assert CIFAR100_MEAN == (0.5071, 0.4867, 0.4408) and CIFAR100_STD == (0.2675, 0.2565, 0.2761)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normalize(device, dtype):
    images = np.random.default_rng(0).random((5, 3, 4, 4)).astype(dtype)
    out = to_device(normalize(to_device(images, device), CIFAR10_MEAN, CIFAR10_STD), "cpu")
    assert out.dtype == dtype and out.shape == images.shape
    for c in range(3):
        expected = (images[:, c].astype(np.float64) - CIFAR10_MEAN[c]) / CIFAR10_STD[c]
        np.testing.assert_allclose(out[:, c], expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError):
        Normalize((0.5, 0.5), (0.1, 0.1, 0.1))


def test_synthetic_mean_and_std_are_measured():
    ds = SyntheticImages(100, seed=0)
    x = ds.images.astype(np.float64) / 255
    np.testing.assert_allclose(ds.mean, x.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(ds.std, x.std(axis=(0, 2, 3)), rtol=1e-9)


def test_mixup_blends_images_and_targets(device):
    b = 10  # labels 0..9 all different, so each target row shows its two sources
    images = np.random.default_rng(0).random((b, 3, 8, 8), dtype=np.float32)
    labels = np.arange(b)
    x, t = mixup(to_device(images, device), to_device(labels, device), 0.4, b, np.random.default_rng(3))
    x, t = to_device(x, "cpu"), to_device(t, "cpu")
    assert x.shape == images.shape and x.dtype == np.float32 and t.shape == (b, b) and t.dtype == np.float32
    np.testing.assert_allclose(t.sum(axis=1), 1, atol=1e-6)
    lam = t[np.arange(b), labels]
    for i in range(b):
        if lam[i] < 1 - 1e-6:
            j = int(np.argmax(np.where(np.arange(b) == i, -1, t[i])))
            np.testing.assert_allclose(x[i], lam[i] * images[i] + (1 - lam[i]) * images[j], atol=1e-5)


def test_cutmix_pastes_a_box_and_weights_targets_by_area(device):
    b = 10
    images = np.random.default_rng(0).random((b, 3, 16, 16), dtype=np.float32)
    labels = np.arange(b)
    x, t = cutmix(to_device(images, device), to_device(labels, device), 1.0, b, np.random.default_rng(5))
    x, t = to_device(x, "cpu"), to_device(t, "cpu")
    assert x.shape == images.shape and x.dtype == np.float32 and t.shape == (b, b)
    np.testing.assert_allclose(t.sum(axis=1), 1, atol=1e-6)
    for i in range(b):
        same = (x[i] == images[i]).all(axis=0)  # (16, 16): pixels kept
        area = 1 - same.mean()
        np.testing.assert_allclose(t[i, i], 1 - area, atol=1e-6)
        if area > 0:
            j = int(np.argmax(np.where(np.arange(b) == i, -1, t[i])))
            np.testing.assert_allclose(t[i, j], area, atol=1e-6)
            np.testing.assert_array_equal(x[i][:, ~same], images[j][:, ~same])
            rows, cols = np.nonzero(~same)  # the pasted pixels form one box
            assert (~same)[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()


def test_transform_objects_compose_and_keep_shapes(device):
    images = to_device(np.random.default_rng(0).random((6, 3, 32, 32), dtype=np.float32), device)
    labels = to_device(np.arange(6) % 3, device)
    rng = np.random.default_rng(0)
    pipeline = Compose([RandomCrop(4), HorizontalFlip(), Normalize(CIFAR10_MEAN, CIFAR10_STD)])
    x, y = pipeline(images, labels, rng)
    assert x.shape == images.shape and x.dtype == np.float32 and y is labels
    x, y = Compose([Mixup(0.2, 3), CutMix(1.0, 3)])(images, labels, rng)  # soft targets pass through
    y = to_device(y, "cpu")
    assert y.shape == (6, 3) and np.allclose(y.sum(axis=1), 1)
    assert "RandomCrop(pad=4)" in repr(pipeline)


def test_loader_with_mixup_yields_soft_targets():
    ds = SyntheticImages(20, seed=0)
    x, y = next(iter(DataLoader(ds, 8, transform=Mixup(0.2, ds.num_classes))))
    assert y.shape == (8, 10) and y.dtype == np.float32
    np.testing.assert_allclose(y.numpy().sum(axis=1), 1, atol=1e-6)


# --------------------------------------------------------------------------- full disks and damaged names
def refusal(root):
    """The message of the DatasetError that loading CIFAR-10 into root raises."""
    with pytest.raises(DatasetError) as err:
        CIFAR10(root=root, progress=False)
    return str(err.value)


def test_a_full_disk_while_downloading_names_the_file_not_the_network(tmp_path, monkeypatch,
                                                                     with_file_size_limit):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    message = with_file_size_limit(4096, lambda: refusal(root))
    assert f"writing {root / tiny.spec.filename} failed: File too large" in message
    assert "network" not in message and tree(root) == []


def test_a_full_disk_while_unpacking_names_the_folder_not_a_corrupt_archive(tmp_path, monkeypatch,
                                                                          with_file_size_limit, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    root.mkdir()
    (root / tiny.spec.filename).write_bytes(tiny.archive.read_bytes())
    message = with_file_size_limit(4096, lambda: refusal(root))
    assert f"unpacking {root / tiny.spec.filename} into {root} failed: File too large" in message
    assert "corrupted" not in message and tree(root) == [tiny.spec.filename]


def test_a_label_name_file_that_is_not_utf8_is_named(tmp_path, monkeypatch, no_network):
    tiny = make_tiny(tmp_path, "cifar10")
    monkeypatch.setitem(ARCHIVES, "cifar10", tiny.spec)
    root = tmp_path / "data"
    with tarfile.open(tiny.archive) as tar:
        tar.extractall(root, filter="data")
    meta = root / "cifar-10-batches-bin" / "batches.meta.txt"
    meta.write_bytes(meta.read_bytes().replace(b"cat", b"c\xe4t"))
    with pytest.raises(DatasetError, match=rf"{meta}, line 4: not UTF-8 text \(byte 0xe4\)"):
        CIFAR10(root=root, progress=False)
