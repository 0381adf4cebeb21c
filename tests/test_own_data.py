"""Your own data: image folders, npz arrays and CSV/TSV text, read and trained on through the
example scripts (one epoch each, in a subprocess, as a user runs them), and every error a user
can meet there: one line that names the file, the line or the column. Nothing is downloaded;
the fixtures are built here (PNGs without Pillow, so that the errors are tested without it)."""

import builtins
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from tinymlp import data, plot
from tinymlp.checkpoint import read_meta
from tinymlp.data import DatasetError
from tinymlp.data.folder import ImageFolder, held_out_split, load_npz

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
try:
    import PIL  # noqa: F401
    HAVE_PIL = True
except ImportError:
    HAVE_PIL = False
needs_pillow = pytest.mark.skipif(not HAVE_PIL, reason="decoding images needs Pillow (the [images] extra)")


def write_png(path, pixels):
    """A PNG file of uint8 pixels (H, W, 3) or (H, W), written without Pillow."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w = pixels.shape[:2]
    colour = 2 if pixels.ndim == 3 else 0
    raw = b"".join(b"\x00" + pixels[r].tobytes() for r in range(h))   # filter 0 on every row

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, colour, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


COLOURS = {"cat": (220, 40, 40), "dog": (40, 40, 220), "owl": (40, 200, 40)}


def image_folder(root, classes=("cat", "dog"), per_class=(8, 3), size=(20, 24)):
    """root/train/<class>/*.png and root/test/<class>/*.png: each class a colour, with noise."""
    rng = np.random.default_rng(0)
    for split, n in zip(("train", "test"), per_class):
        for name in classes:
            for i in range(n):
                pixels = np.clip(rng.normal(COLOURS[name], 25, size=(*size, 3)), 0, 255)
                write_png(root / split / name / f"{i}.png", pixels)
    return root


def run(script, *args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "TINYMLP_DATA": str(cwd / "no-data-here")}
    return subprocess.run([sys.executable, str(EXAMPLES / script), *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def ok(result):
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def refused(result, *words):
    """Exit status 2 and one line on stderr holding ``words``, no traceback."""
    assert result.returncode == 2, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# ---------------------------------------------------------------------- image folders
@needs_pillow
def test_image_folder_reads_classes_resizes_and_converts_to_rgb(tmp_path):
    from PIL import Image

    root = image_folder(tmp_path / "pets")
    Image.fromarray(np.full((9, 13), 128, np.uint8), mode="L").save(root / "train" / "cat" / "grey.jpg")
    Image.fromarray(np.zeros((10, 10, 4), np.uint8), mode="RGBA").save(root / "train" / "dog" / "alpha.png")
    (root / "train" / "dog" / "notes.txt").write_text("not an image")          # skipped: not an image suffix
    (root / "train" / "dog" / ".hidden.png").write_bytes(b"")                # skipped: hidden
    train = ImageFolder(root, "train", size=16)
    test = ImageFolder(root, "test", size=16, classes=train.classes)
    assert train.classes == ("cat", "dog") and len(train) == 18 and len(test) == 6
    assert train.images.shape == (18, 3, 16, 16) and train.images.dtype == np.uint8
    assert list(np.bincount(train.labels)) == [9, 9]
    cat = train.images[train.labels == 0][:8].astype(float).mean(axis=(0, 2, 3))
    assert cat[0] > 150 and cat[2] < 100                                     # red stays red after the resize
    grey = train.images[train.files.index(root / "train" / "cat" / "grey.jpg")]
    assert abs(int(grey[0].mean()) - 128) <= 2 and (grey[0] == grey[2]).all()


def test_image_folder_errors_name_the_folder_or_file(tmp_path):
    root = image_folder(tmp_path / "pets")
    with pytest.raises(DatasetError, match="no test2/ folder"):
        ImageFolder(root, "test2")
    with pytest.raises(DatasetError, match="no such folder"):
        ImageFolder(tmp_path / "nowhere", "train")
    (root / "train" / "owl").mkdir()
    with pytest.raises(DatasetError, match=r"train/owl: an empty class"):
        ImageFolder(root, "train")
    write_png(root / "train" / "owl" / "0.png", np.zeros((4, 4, 3)))
    with pytest.raises(DatasetError, match=r"differ from the training split's \(missing owl\)"):
        ImageFolder(root, "test", classes=("cat", "dog", "owl"))
    with pytest.raises(DatasetError, match="not in the training classes: dog"):
        ImageFolder(root, "test", classes=("cat",))


@needs_pillow
def test_an_unreadable_image_is_named(tmp_path):
    root = image_folder(tmp_path / "pets")
    (root / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DatasetError, match=r"broken\.png: cannot be read as an image"):
        ImageFolder(root, "train")


def test_without_pillow_the_message_says_how_to_install_it(tmp_path, monkeypatch):
    root = image_folder(tmp_path / "pets")
    real_import = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError("No module named 'PIL'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(DatasetError, match=r'needs Pillow.*pip install -e "\.\[images\]"') as err:
        ImageFolder(root, "train")
    assert "\n" not in str(err.value)


def test_held_out_split_is_stratified_seeded_and_disjoint():
    labels = np.array([0] * 50 + [1] * 20 + [2] * 1)
    train, test = held_out_split(labels, 0.1, seed=0)
    assert sorted(np.concatenate([train, test])) == list(range(71))
    assert list(np.bincount(labels[test], minlength=3)) == [5, 2, 0]         # a lone example stays in training
    again = held_out_split(labels, 0.1, seed=0)
    assert (again[1] == test).all() and not (held_out_split(labels, 0.1, seed=1)[1] == test).all()
    with pytest.raises(ValueError, match="fraction"):
        held_out_split(labels, 1.0)


# ---------------------------------------------------------------------- npz arrays
def save_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


# ---------------------------------------------------------------------- one rule for every format
def test_npz_labels_are_numbered_as_csv_labels_are(tmp_path):
    x = np.zeros((6, 8, 8, 3), np.uint8)
    path = save_npz(tmp_path / "d.npz", x_train=x, y_train=np.array([1, 2, 3, 3, 2, 1]), x_test=x[:2],
                    y_test=np.array([3, 1]))
    train, test = load_npz(path, size=8)
    assert train.classes == ("1", "2", "3") and list(train.labels) == [0, 1, 2, 2, 1, 0] and list(test.labels) == [2, 0]
    csv = tmp_path / "d.csv"
    csv.write_text("text,label\n" + "".join(f"t{i},{y}\n" for i, y in enumerate([1, 2, 3, 3, 2, 1])))
    table = data.read_text_table(csv)
    assert table.classes == train.classes and list(table.labels) == list(train.labels)


@needs_pillow
@pytest.mark.parametrize("fmt", ["folder", "npz", "csv"])
def test_one_class_is_refused_in_every_format(tmp_path, fmt):
    if fmt == "folder":
        image_folder(tmp_path / "pets", classes=("cat",))
        read = lambda: ImageFolder(tmp_path / "pets", "train")                          # noqa: E731
    elif fmt == "npz":
        x = np.zeros((4, 8, 8, 3), np.uint8)
        save_npz(tmp_path / "d.npz", x_train=x, y_train=np.full(4, 7), x_test=x, y_test=np.full(4, 7))
        read = lambda: load_npz(tmp_path / "d.npz")                                     # noqa: E731
    else:
        (tmp_path / "d.csv").write_text("text,label\na,cat\nb,cat\n")
        read = lambda: data.read_text_table(tmp_path / "d.csv")                         # noqa: E731
    with pytest.raises(DatasetError, match="only one .*; a classifier needs at least two classes"):
        read()


@needs_pillow
def test_class_names_that_differ_only_in_case_are_refused(tmp_path):
    root = tmp_path / "food"
    for name in ("Food", "food", "drink"):
        write_png(root / "train" / name / "0.png", np.zeros((4, 4, 3)))
    with pytest.raises(DatasetError, match="the class folders 'Food' and 'food' differ only in case"):
        ImageFolder(root, "train")
    x = np.zeros((3, 8, 8, 3), np.uint8)
    save_npz(tmp_path / "d.npz", x_train=x, y_train=np.arange(3), x_test=x, y_test=np.arange(3),
             classes=np.array(["Food", "drink", "food"]))
    with pytest.raises(DatasetError, match="'Food' and 'food' differ only in case"):
        load_npz(tmp_path / "d.npz")


@needs_pillow
def test_torchvisions_own_layout_root_class_images_is_read(tmp_path):
    root = tmp_path / "pets"
    for name in ("cat", "dog"):
        for i in range(3):
            write_png(root / name / f"{i}.png", np.full((6, 6, 3), 40 * i))
    assert data.folder.has_class_folders(root) and not data.folder.has_class_folders(tmp_path / "nowhere")
    images = ImageFolder(root, split=None, size=8)
    assert images.classes == ("cat", "dog") and len(images) == 6 and "pets: 6 images" in repr(images)


@pytest.mark.parametrize("layout", ["nhwc", "nchw", "grey", "float"])
def test_npz_layouts_and_dtypes(tmp_path, layout):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(12, 8, 8, 3), dtype=np.uint8)
    given = {"nhwc": x, "nchw": x.transpose(0, 3, 1, 2), "grey": x[..., 0], "float": x / 255.0}[layout]
    path = save_npz(tmp_path / "d.npz", x_train=given, y_train=np.arange(12) % 3, x_test=given[:4],
                    y_test=np.array([0, 1, 2, 0]), classes=np.array(["a", "b", "c"]))
    train, test = load_npz(path, size=8)
    assert train.images.shape == (12, 3, 8, 8) and test.images.shape == (4, 3, 8, 8)
    expected = x.transpose(0, 3, 1, 2) if layout != "grey" else np.repeat(x[:, None, :, :, 0], 3, axis=1)
    assert (train.images == expected).all()
    assert train.classes == ("a", "b", "c") and list(test.labels) == [0, 1, 2, 0]
    assert load_npz(path, size=16)[0].images.shape == (12, 3, 16, 16)


@pytest.mark.parametrize("change, words", [
    ({"x_test": None}, "no array x_test"),
    ({"x_train": np.zeros((4, 8), np.uint8)}, "x_train has shape (4, 8)"),
    ({"x_train": np.zeros((4, 8, 8, 5), np.uint8)}, "C = 1 or 3"),
    ({"x_train": np.full((4, 8, 8, 3), 2.0)}, "x_train is float64 with values in [2, 2]"),
    ({"x_train": np.full((4, 8, 8, 3), 300)}, "values in [300, 300]; expected pixels 0..255"),
    ({"x_train": np.zeros((4, 8, 8, 3), bool)}, "x_train has dtype bool"),
    ({"y_train": np.zeros(3, np.int64)}, "y_train has shape (3,); expected (4,)"),
    ({"y_train": np.full(4, 0.5)}, "y_train has dtype float64"),
    ({"y_test": np.array([0, -1])}, "y_test: the label '-1' is not a class of the training data (0, 1)"),
    ({"classes": np.array(["a"])}, "classes: only one class name, 'a'; a classifier needs at least two classes"),
    ({"classes": np.array(["a", "b"]), "y_test": np.array([0, 2])}, "y_test holds the label 2, which names no class"),
    ({"classes": np.array(["a", "b", "c"])}, "the class 'c' (label 2) has no image in y_train"),
    ({"x_train": np.full((4, 8, 8, 3), np.nan)}, "x_train holds NaN (768 values, the first in image 0)"),
    ({"y_train": np.array([0, 1, np.nan, 1])}, "y_train has dtype float64 and holds NaN"),
    ({"x_test": np.zeros((2, 6, 6, 3), np.uint8)}, "x_train images are (3, 8, 8) but x_test images (3, 6, 6)"),
])
def test_npz_errors_name_the_file_and_the_array(tmp_path, change, words):
    arrays = {"x_train": np.zeros((4, 8, 8, 3), np.uint8), "y_train": np.array([0, 1, 0, 1]),
              "x_test": np.zeros((2, 8, 8, 3), np.uint8), "y_test": np.array([0, 1])}
    arrays.update(change)
    path = save_npz(tmp_path / "bad.npz", **{k: v for k, v in arrays.items() if v is not None})
    with pytest.raises(DatasetError) as err:
        load_npz(path)
    assert str(path) in str(err.value) and words in str(err.value)


def test_npz_that_needs_pickle_or_is_not_an_npz(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, x_train=np.array([None, 1], dtype=object), y_train=[0, 1], x_test=np.zeros((1, 4, 4)), y_test=[0])
    with pytest.raises(DatasetError, match="need pickle"):
        load_npz(path)
    (tmp_path / "text.npz").write_text("hello")
    with pytest.raises(DatasetError, match="not an .npz file"):
        load_npz(tmp_path / "text.npz")
    with pytest.raises(DatasetError, match="no such file"):
        load_npz(tmp_path / "missing.npz")


# ---------------------------------------------------------------------- CSV / TSV text
def test_csv_with_quotes_string_labels_and_a_held_out_split(tmp_path):
    path = tmp_path / "reviews.csv"
    rows = ['text,label,id'] + [f'"a film, number {i}, was {"good" if i % 3 else "bad"}",'
                                f'{"pos" if i % 3 else "neg"},{i}'
                                for i in range(30)]
    path.write_text("\ufeff" + "\n".join(rows) + "\n\n", encoding="utf-8")     # a BOM and an empty last line
    table = data.read_text_table(path, "text", "label")
    assert len(table) == 30 and table.classes == ("neg", "pos") and table.texts[1] == "a film, number 1, was good"
    assert list(table.labels[:4]) == [0, 1, 1, 0] and table.pairs is None
    train, test = data.split_text_dataset(table, 0.2, seed=0)
    assert len(train) + len(test) == 30 and list(np.bincount(test.labels)) == [2, 4]
    assert not set(train.texts) & set(test.texts)


def test_tsv_pairs_and_integer_labels_sorted_as_numbers(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text('premise\thypothesis\tstars\n"quoted" text\tanother\t10\nb\tc\t2\nd\te\t1\n', encoding="utf-8")
    table = data.read_text_table(path, "premise", "stars", pair_column="hypothesis")
    assert table.classes == ("1", "2", "10") and list(table.labels) == [2, 1, 0]
    assert table.texts[0] == '"quoted" text' and table.pairs == ["another", "c", "e"]     # TSV quotes are text
    test = data.read_text_table(path, "premise", "stars", pair_column="hypothesis", classes=("1", "2", "10", "99"))
    assert list(test.labels) == [2, 1, 0]


@pytest.mark.parametrize("content, kwargs, words", [
    ("text,label\nhello,1\nbye,0\n", {"label_column": "sentiment"},
     "no column 'sentiment' (--label-column); its header has 'text', 'label'"),
    ("text,label\nhello,1\nbye,0,extra\n", {}, "line 3: 3 fields, but the header has 2"),
    ("text,label\nhello,1\n ,0\n", {}, "line 3: the column 'text' (--text-column) is empty"),
    ("text,label\nhello,1\nbye,\n", {}, "line 3: the column 'label' (--label-column) is empty"),
    ("text,label\nhello,1\nbye,1\n", {}, "only one label, '1'; a classifier needs at least two classes"),
    ("text,label\nhello,Food\nbye,food\n", {}, "the labels 'Food' and 'food' differ only in case"),
    ("text,label\n", {}, "a header but no rows"),
    ("", {}, "empty, or no header line"),
    ('text,label\n"unclosed,1\n', {}, "line 2: unexpected end of data (a double quote that is never closed?)"),
    ("text,label\nhello,2\n", {"classes": ("0", "1")},
     "(column 'label'): the label '2' is not a class of the training data (0, 1)"),
])
def test_csv_errors_name_the_file_line_and_column(tmp_path, content, kwargs, words):
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DatasetError) as err:
        data.read_text_table(path, **{"text_column": "text", "label_column": "label", **kwargs})
    assert str(path) in str(err.value) and words in str(err.value)


def test_text_files_must_be_utf8_and_exist(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("first line\nun café\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1\.txt, line 2: not UTF-8 text \(byte 0xe9\)"):
        data.read_lines(path)
    with pytest.raises(DatasetError, match="no such file"):
        data.read_text_table(tmp_path / "missing.csv")
    with pytest.raises(DatasetError, match="not a file"):
        data.read_lines(tmp_path)
    (tmp_path / "ok.txt").write_text("  one  \n\n two\n", encoding="utf-8")
    assert data.read_lines(tmp_path / "ok.txt") == ["one", "two"]


def test_confusion_matrix_names_the_classes(tmp_path):
    fig = plot.confusion_matrix([0, 0, 1, 2, 2], [0, 1, 1, 2, 0], ("ant", "bee", "cow"), tmp_path / "c.png",
                                title="test")
    assert (tmp_path / "c.png").stat().st_size > 0
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ant", "bee", "cow"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ant (50%)", "bee (100%)", "cow (50%)"]
    assert "accuracy 60.0% of 5" in ax.get_title()


# ---------------------------------------------------------------------- through the scripts
TINY_IMAGE = ["--dim", "16", "--depth", "1", "--epochs", "1", "--batch-size", "4", "--no-progress"]


@needs_pillow
@pytest.mark.slow
def test_train_cifar_gmlp_on_an_image_folder(tmp_path):
    root = image_folder(tmp_path / "pets")
    out = tmp_path / "run"
    stdout = ok(run("train_cifar_gmlp.py", "--dataset", "folder", "--data-dir", root, *TINY_IMAGE, "--ffn-dim", "32",
                    "--out", out, cwd=tmp_path))
    assert "folder: 14 train / 2 validation / 6 test images" in stdout and "confusion.png" in stdout
    meta = read_meta(out / "checkpoint.npz")
    assert meta["classes"] == ["cat", "dog"] and meta["dataset"] == "folder"
    assert meta["model_config"]["image_size"] == 32
    for name in ("metrics.json", "curves.png", "spatial_weights.png", "confusion.png"):
        assert (out / name).stat().st_size > 0

    # a resumed run must see the same classes
    write_png(root / "train" / "owl" / "0.png", np.zeros((4, 4, 3)))
    write_png(root / "test" / "owl" / "0.png", np.zeros((4, 4, 3)))
    refused(run("train_cifar_gmlp.py", "--dataset", "folder", "--data-dir", root, "--epochs", "2", "--no-progress",
                "--resume", "auto", "--out", out, cwd=tmp_path),
            "trained on the classes cat, dog", "has cat, dog, owl")


@needs_pillow
@pytest.mark.slow
def test_an_image_folder_without_test_holds_some_out(tmp_path):
    root = image_folder(tmp_path / "pets", per_class=(10, 0))
    stdout = ok(run("train_cifar_mixer.py", "--dataset", "folder", "--data-dir", root, *TINY_IMAGE,
                    "--test-fraction", "0.2", "--out", tmp_path / "run", cwd=tmp_path))
    assert "no test/ folder: 4 of its 20 images" in stdout
    assert "folder: 14 train / 2 validation / 4 test images" in stdout


@pytest.mark.slow
def test_train_cifar_mixer_on_npz_arrays(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 28, 28), dtype=np.uint8)            # grey 28 x 28, resized to 32
    path = save_npz(tmp_path / "digits.npz", x_train=x[:24], y_train=np.arange(24) % 3, x_test=x[24:],
                    y_test=np.arange(6) % 3, classes=np.array(["zero", "one", "two"]))
    out = tmp_path / "run"
    stdout = ok(run("train_cifar_mixer.py", "--dataset", "npz", "--data-dir", path, *TINY_IMAGE, "--out", out,
                    cwd=tmp_path))
    assert "npz: 21 train / 3 validation / 6 test images" in stdout
    assert read_meta(out / "checkpoint.npz")["classes"] == ["zero", "one", "two"]
    assert (out / "confusion.png").stat().st_size > 0


def test_image_data_errors_are_one_line(tmp_path):
    refused(run("train_cifar_gmlp.py", "--dataset", "folder", *TINY_IMAGE, cwd=tmp_path),
            "--dataset folder needs --data-dir")
    refused(run("train_cifar_gmlp.py", "--dataset", "npz", "--data-dir", tmp_path / "none.npz", *TINY_IMAGE,
                cwd=tmp_path),
            "none.npz: no such file")
    root = image_folder(tmp_path / "pets")
    (root / "test" / "dog").rename(root / "test" / "wolf")
    refused(run("train_cifar_gmlp.py", "--dataset", "folder", "--data-dir", root, *TINY_IMAGE, cwd=tmp_path),
            "missing dog", "not in the training classes: wolf")
    refused(run("train_cifar_gmlp.py", "--dataset", "folder", "--data-dir", root, "--test-fraction", "1",
                *TINY_IMAGE, cwd=tmp_path), "--test-fraction 1: expected a value in (0, 1)")


def reviews_csv(path, n=60):
    words = ["good", "great", "fine"], ["bad", "dull", "poor"]
    rows = ["id,review,sentiment"] + [f'{i},"the film, take {i}, was {words[i % 2][i % 3]}",'
                                      f'{("neg", "pos")[i % 2 == 0]}'
                                      for i in range(n)]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


TINY_TEXT = ["--seq-len", "16", "--dim", "16", "--depth", "1", "--ffn-dim", "32", "--vocab-size", "120",
             "--batch-size", "8", "--epochs", "1", "--no-progress"]


@pytest.mark.slow
def test_train_text_gmlp_on_a_csv_file(tmp_path):
    path = reviews_csv(tmp_path / "reviews.csv")
    out = tmp_path / "run"
    stdout = ok(run("train_text_gmlp.py", "--dataset", "csv", "--train-file", path, "--text-column", "review",
                    "--label-column", "sentiment", *TINY_TEXT, "--out", out, cwd=tmp_path))
    assert "6 of the 60 rows" in stdout and "csv: 48 train / 6 validation / 6 test sentences" in stdout
    meta = read_meta(out / "checkpoint.npz")
    assert meta["classes"] == ["neg", "pos"] and meta["dataset"] == "csv"
    assert (out / "confusion.png").stat().st_size > 0 and (out / "tokenizer.json").is_file()
    assert json.loads((out / "metrics.json").read_text())["dataset"] == "csv"


@pytest.mark.slow
def test_train_text_gmlp_on_tsv_pairs_with_a_test_file(tmp_path):
    rows = ["a\tb\tlabel"] + [f"word{i % 5} here\tword{(i + i % 2) % 5} there\t{i % 2}" for i in range(40)]
    (tmp_path / "train.tsv").write_text("\n".join(rows[:33]) + "\n", encoding="utf-8")
    (tmp_path / "test.tsv").write_text("\n".join([rows[0]] + rows[33:]) + "\n", encoding="utf-8")
    stdout = ok(run("train_text_gmlp.py", "--dataset", "csv", "--train-file", tmp_path / "train.tsv", "--test-file",
                    tmp_path / "test.tsv", "--text-column", "a", "--pair-column", "b", *TINY_TEXT,
                    "--out", tmp_path / "run", cwd=tmp_path))
    assert "csv: 28 train / 4 validation / 8 test sentence pairs" in stdout


@pytest.mark.slow
def test_pretrain_mlm_on_a_csv_file_and_on_lines(tmp_path):
    path = reviews_csv(tmp_path / "reviews.csv")
    stdout = ok(run("pretrain_mlm.py", "--dataset", "csv", "--train-file", path, "--text-column", "review",
                    *TINY_TEXT, "--out", tmp_path / "mlm", cwd=tmp_path))
    assert "csv: 57 train / 3 held-out lines" in stdout and "held-out perplexity" in stdout
    assert "classes" not in read_meta(tmp_path / "mlm" / "checkpoint.npz") or \
        read_meta(tmp_path / "mlm" / "checkpoint.npz")["classes"] is None
    lines = tmp_path / "corpus.txt"
    lines.write_bytes(b"a good film\nun caf\xe9\n")
    refused(run("pretrain_mlm.py", "--text", lines, *TINY_TEXT, cwd=tmp_path), "corpus.txt, line 2: not UTF-8")


@pytest.mark.parametrize("script, flags, words", [
    ("train_text_gmlp.py", ["--dataset", "csv"], "--dataset csv needs --train-file FILE"),
    ("train_text_gmlp.py", ["--dataset", "csv", "--train-file", "missing.csv"], "missing.csv: no such file"),
    ("train_text_gmlp.py", ["--dataset", "synthetic", "--train-file", "reviews.csv"],
     "--train-file is read with --dataset csv"),
    ("train_text_gmlp.py", ["--dataset", "csv", "--train-file", "reviews.csv"], "no column 'text' (--text-column)"),
    ("train_text_gmlp.py", ["--dataset", "csv", "--train-file", "reviews.csv", "--text-column", "review",
                            "--label-column", "id", "--test-file", "reviews.csv", "--test-fraction", "0"],
     "--test-fraction 0: expected a value in (0, 1)"),
    ("pretrain_mlm.py", ["--dataset", "synthetic", "--text", "reviews.csv"], "--text is read with --dataset text"),
    ("pretrain_mlm.py", ["--dataset", "csv"], "--dataset csv needs --train-file FILE"),
])
def test_text_file_flag_errors_are_one_line(tmp_path, script, flags, words):
    reviews_csv(tmp_path / "reviews.csv")
    refused(run(script, *flags, *TINY_TEXT, cwd=tmp_path), words)


def test_a_test_file_with_an_unknown_label_is_refused(tmp_path):
    path = reviews_csv(tmp_path / "reviews.csv")
    other = tmp_path / "other.csv"
    other.write_text('id,review,sentiment\n1,"a fine film",neutral\n', encoding="utf-8")
    refused(run("train_text_gmlp.py", "--dataset", "csv", "--train-file", path, "--test-file", other,
                "--text-column", "review", "--label-column", "sentiment", *TINY_TEXT, cwd=tmp_path),
            "other.csv", "the label 'neutral'", "not a class of the training data (neg, pos)")


@pytest.mark.slow
def test_finetune_on_npz_arrays_gets_a_head_for_their_classes(tmp_path):
    from tinymlp import interop, models

    interop.save_timm(models.create("mixer_cifar", dim=16, depth=1, token_mlp_dim=8, channel_mlp_dim=32),
                      tmp_path / "tiny.npz")
    x = np.random.default_rng(0).integers(0, 256, size=(20, 32, 32, 3), dtype=np.uint8)
    path = save_npz(tmp_path / "three.npz", x_train=x[:15], y_train=np.arange(15) % 3, x_test=x[15:],
                    y_test=np.arange(5) % 3)
    out = tmp_path / "run"
    stdout = ok(run("finetune.py", "--pretrained", tmp_path / "tiny.npz", "--dataset", "npz", "--data-dir", path,
                    "--epochs", "1", "--batch-size", "5", "--no-progress", "--out", out, cwd=tmp_path))
    assert "a new zero head for 3 classes" in stdout
    assert read_meta(out / "checkpoint.npz")["classes"] == ["0", "1", "2"]
