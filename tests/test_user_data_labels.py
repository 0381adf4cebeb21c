"""One label rule for every format, the same in every process (tinymlp.data.labels): class names
normalised (Unicode NFC, bytes decoded); numeric names sorted and compared as numbers, so that
numbered folders sort 1, 2, 10 and two spellings of one number ("01" and "1", "1.0" and "1") are
refused naming both; two names that are one name after normalisation refused naming both; the
class order never depends on the hash seed of the process."""

import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from tinymlp.data import DatasetError, read_text_table
from tinymlp.data.folder import ImageFolder, load_npz
from tinymlp.data.labels import class_name, label_order, number_labels
from test_own_data import needs_pillow, write_png

ROOT = Path(__file__).resolve().parent.parent
NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def csv(path, labels):
    path.write_text("text,label\n" + "".join(f"row {i},{label}\n" for i, label in enumerate(labels)),
                    encoding="utf-8")
    return path


# ---------------------------------------------------------------------- numbers
def test_numbered_names_sort_as_numbers():
    assert label_order(["10", "2", "9", "1"]) == ["1", "2", "9", "10"]
    assert label_order(["0.5", "-1", "10", "2.25"]) == ["-1", "0.5", "2.25", "10"]
    assert label_order(["10", "2", "cat"]) == ["10", "2", "cat"]                  # not all numbers: as text


@pytest.mark.parametrize("labels,both", [(["01", "1", "2"], ("01", "1")), (["1.0", "1", "2"], ("1", "1.0")),
                                         (["2", "1e0", "1"], ("1", "1e0"))])
def test_two_spellings_of_one_number_are_refused_naming_both(tmp_path, labels, both):
    with pytest.raises(DatasetError) as caught:
        read_text_table(csv(tmp_path / "t.csv", labels))
    message = str(caught.value)
    assert f"the labels {both[0]!r} and {both[1]!r} are the same number written two ways" in message
    assert "t.csv" in message


@needs_pillow
def test_numbered_class_folders_are_numbered_as_numbers(tmp_path):
    for name in ("10", "2", "9"):
        write_png(tmp_path / "train" / name / "a.png", np.full((4, 4, 3), int(name) * 20))
    train = ImageFolder(tmp_path, "train", size=4)
    assert train.classes == ("2", "9", "10") or list(train.classes) == ["2", "9", "10"]
    assert [int(train.images[train.labels == k][0, 0, 0, 0]) for k in range(3)] == [40, 180, 200]


# ---------------------------------------------------------------------- Unicode and bytes
def test_a_label_in_two_unicode_forms_is_one_class(tmp_path):
    table = read_text_table(csv(tmp_path / "t.csv", [NFC, NFD, "thé", NFD]))
    assert list(table.classes) == [NFC, "thé"] and table.labels.tolist() == [0, 0, 1, 0]
    test = read_text_table(csv(tmp_path / "test.csv", [NFD, "thé"]), classes=table.classes)
    assert test.labels.tolist() == [0, 1]


@needs_pillow
def test_two_folders_that_are_one_name_in_two_unicode_forms_are_refused(tmp_path):
    for name in (NFC, NFD, "thé"):
        write_png(tmp_path / "train" / name / "a.png", np.zeros((4, 4, 3)))
    with pytest.raises(DatasetError, match=r"the class folders 'cafe\\u0301' and 'caf\\xe9' are one name written in "
                                           r"two Unicode forms"):
        ImageFolder(tmp_path, "train", size=4)


def test_npz_class_names_stored_as_bytes_are_text(tmp_path):
    x = np.zeros((4, 8, 8, 3), np.uint8)
    np.savez(tmp_path / "d.npz", x_train=x, y_train=np.array([0, 1, 0, 1]), x_test=x[:2], y_test=np.array([0, 1]),
             classes=np.array([b"cat", "caf\xc3\xa9".encode("latin-1")]))
    train, _ = load_npz(tmp_path / "d.npz", size=8)
    assert list(train.classes) == ["cat", NFC]
    np.savez(tmp_path / "bad.npz", x_train=x, y_train=np.array([0, 1, 0, 1]), x_test=x[:2], y_test=np.array([0, 1]),
             classes=np.array([b"cat", b"caf\xe9"]))
    with pytest.raises(DatasetError, match=r"bad.npz: classes: the class name b'caf\\xe9' is not UTF-8 text"):
        load_npz(tmp_path / "bad.npz", size=8)


def test_class_name_rules():
    assert class_name(b"dog", "x") == "dog" and class_name(np.bytes_(b"dog"), "x") == "dog"
    assert class_name(np.str_(NFD), "x") == NFC and class_name(7, "x") == "7"
    assert number_labels([b"b", "a", NFD], "x")[0] == ["a", "b", NFC]


# ---------------------------------------------------------------------- the same in every process
def test_the_class_order_does_not_depend_on_the_hash_seed(tmp_path):
    csv(tmp_path / "t.csv", ["1", "01", "001", "2", "02", "10", "3", "03"])    # ties, if numbers were merged
    code = ("from tinymlp.data import DatasetError, read_text_table\n"
            f"try: print(list(read_text_table({str(tmp_path / 't.csv')!r}).classes))\n"
            "except DatasetError as err: print(err)")
    seen = set()
    for seed in ("0", "1", "2"):
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                                env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        seen.add(result.stdout)
    assert len(seen) == 1, seen
