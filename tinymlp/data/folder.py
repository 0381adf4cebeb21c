"""Your own images: a folder of PNG/JPEG files by class, or arrays in an ``.npz`` file.

    train = ImageFolder("flowers", split="train", size=32)     # flowers/train/<class>/*.png|jpg
    test = ImageFolder("flowers", split="test", size=32, classes=train.classes)
    train, test = load_npz("digits.npz", size=32)               # x_train, y_train, x_test, y_test

Both give ``ImageDataset``s (uint8 (N, 3, size, size), int64 labels, ``classes``), ready for
``DataLoader`` and ``fit``, the same record as CIFAR's.

**Folder layout** (torchvision's ImageFolder): ``root/train/<class>/<image>`` and
``root/test/<class>/<image>`` (and ``root/val/<class>/...``), or torchvision's own
``root/<class>/<image>`` (``split=None``); the class names are the sub-folder names, sorted, and
number the classes 0..K-1. Files whose suffix is not an image's (``IMAGE_SUFFIXES``) and hidden
files are skipped; every class folder must hold at least one image, and ``test/`` must have the
classes of ``train/`` (``classes=``). Decoding needs Pillow (``pip install -e ".[images]"`` in the checkout);
each image becomes RGB (grey and palette images too; an alpha channel is dropped) and is resized
to ``size`` x ``size`` with ``tinymlp.data.resize`` (bilinear; the aspect ratio is not kept).

**npz layout**: arrays ``x_train``, ``y_train``, ``x_test``, ``y_test`` and optionally ``classes``
(strings); images (N, H, W) grey, (N, H, W, C) as Keras and PIL store them, or (N, C, H, W), with
C = 1 or 3, integer pixels in 0..255 or floats in [0, 1]; labels integers. Read without
pickle. Without ``classes`` the labels are numbered as a CSV file's are: their distinct values,
sorted, are the classes 0..K-1 and name them (labels 0..K-1 stay as they are, labels 1..3 become
0..2 named "1".."3"); with ``classes`` the labels index it, and every class needs a training image.

Both formats follow the class rules every format shares (``tinymlp.data.labels``): at least two
classes, no two names that differ only in case. Every problem is one ``DatasetError`` that names
the file (or folder) and what was expected.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from ..files import npz_problem
from .archive import DatasetError
from .labels import check_class_names, class_name, class_names, held_out_split, label_order, number_labels
from .loader import ImageDataset, as_count
from .transforms import resize

__all__ = ["IMAGE_SUFFIXES", "ImageFolder", "as_images", "has_class_folders", "held_out_split", "load_npz",
           "read_image", "resize_images", "subset"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
PILLOW_MISSING = ('reading PNG/JPEG images needs Pillow, which is not installed: pip install -e ".[images]" '
                  "in your tinymlp checkout (or pip install pillow), or give the images as arrays with "
                  "--dataset npz")


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError(PILLOW_MISSING) from None
    return Image


def resize_images(images, size):
    """uint8 images (N, C, H, W) resized to ``size`` x ``size`` with ``resize`` (bilinear), as uint8."""
    size = as_count(size, "resize_images: size")
    images = np.asarray(images)
    if images.shape[-2:] == (size, size):
        return np.ascontiguousarray(images, dtype=np.uint8)
    out = np.empty(images.shape[:-2] + (size, size), dtype=np.uint8)
    for start in range(0, len(images), 1024):                 # float32 copies of 1,024 images at most
        chunk = resize(images[start:start + 1024].astype(np.float32), size)
        out[start:start + 1024] = np.clip(np.rint(chunk), 0, 255)
    return out


# --------------------------------------------------------------------------- a folder of images
def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def class_folders(folder: Path, where=None, kind="class folder") -> dict:
    """{class name: its folder} of the visible sub-folders of ``folder``, in the classes' order: the
    rules of every format (``tinymlp.data.labels``), refused in one sentence naming ``where``."""
    raw = sorted(p.name for p in folder.iterdir() if p.is_dir() and _visible(p))
    names = class_names(raw, where or str(folder), kind) if len(raw) > 1 else [class_name(n, where) for n in raw]
    paths = {name: folder / given for name, given in zip(names, raw)}
    return {name: paths[name] for name in label_order(paths)}


def _image_files(folder: Path) -> list:
    return sorted(p for p in folder.rglob("*") if p.is_file() and _visible(p)
                  and p.suffix.lower() in IMAGE_SUFFIXES)


def has_class_folders(root) -> bool:
    """Whether ``root`` holds images in sub-folders: torchvision's ``root/<class>/<image>`` layout."""
    root = Path(root)
    return root.is_dir() and any(_image_files(path) for path in class_folders(root).values())


def read_image(path, size: int) -> np.ndarray:
    """One image file as uint8 (3, size, size): RGB, resized bilinearly; DatasetError naming the file."""
    return _decode(Path(path), as_count(size, "read_image: size"), _pillow())


def _decode(path: Path, size: int, Image) -> np.ndarray:
    """One image file as uint8 (3, size, size); DatasetError naming the file when it cannot be read.

    16-bit grey images (Pillow's modes "I;16..." and "I", as a 16-bit PNG reads) are scaled from
    0..65535 to 0..255; 16-bit colour PNGs Pillow already reads as 8-bit RGB."""
    try:
        with Image.open(path) as im:
            if im.mode.startswith("I;16") or im.mode == "I":
                wide = np.asarray(im, dtype=np.int64)
                if wide.size and (wide.min() < 0 or wide.max() > 65535):
                    raise DatasetError(f"{path}: a {im.mode} image with values in [{wide.min()}, {wide.max()}]; "
                                       "expected 8-bit or 16-bit pixels")
                pixels = np.repeat(np.rint(wide / 257).astype(np.uint8)[..., None], 3, axis=2)
            elif im.mode == "F":
                raise DatasetError(f"{path}: a floating-point image (mode F), whose pixel range is not known; "
                                   "save it with 8-bit or 16-bit pixels")
            else:
                pixels = np.asarray(im.convert("RGB"), dtype=np.uint8)   # grey, palette, RGBA, CMYK -> RGB
    except DatasetError:
        raise
    except Exception as err:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError, ValueError...
        raise DatasetError(f"{path}: cannot be read as an image ({type(err).__name__}: {err})") from None
    return resize_images(pixels.transpose(2, 0, 1)[None], size)[0]


class ImageFolder(ImageDataset):
    """The images of ``root/split/<class>/`` (``split=None``: ``root/<class>/``), resized to
    ``size`` x ``size``, as an ImageDataset.

    ``classes``: the expected class names (give the training split's to the test split: a test
    folder whose classes differ is refused). The per-channel ``mean``/``std`` are measured on
    the images read.
    """

    def __init__(self, root, split="train", size=32, classes=None):
        size = as_count(size, "ImageFolder: size")
        root = Path(root)
        folder = root / split if split is not None else root
        layout = f"{root}/{split}/<class>/<images>" if split is not None else f"{root}/<class>/<images>"
        if not root.is_dir():
            raise DatasetError(f"{root}: no such folder (expected {layout})")
        if not folder.is_dir():
            raise DatasetError(f"{root} has no {split}/ folder: expected {folder}/<class>/<images>, one "
                               f"sub-folder per class (or {root}/<class>/<images>, torchvision's ImageFolder layout)")
        paths = class_folders(folder, f"{folder} (expected {layout})")
        names = list(paths)
        if not names:
            raise DatasetError(f"{folder} has no class folders: expected {layout}")
        if classes is not None and names != [class_name(c) for c in classes]:
            missing = [c for c in classes if c not in names]
            extra = [c for c in names if c not in classes]
            detail = "; ".join(part for part in (
                f"missing {', '.join(missing)}" if missing else "",
                f"not in the training classes: {', '.join(extra)}" if extra else "") if part)
            raise DatasetError(f"{folder}: its class folders differ from the training split's ({detail}); "
                               f"{split or 'the'} and train/ need the same class folders")
        if classes is None:
            check_class_names(names, f"{folder} (expected {layout})", "class folder")
        files, labels = [], []
        for label, name in enumerate(names):
            found = _image_files(paths[name])
            if not found:
                raise DatasetError(f"{paths[name]}: an empty class, no image files in it "
                                   f"(expected {', '.join(IMAGE_SUFFIXES[:3])}, ...)")
            files += found
            labels += [label] * len(found)
        Image = _pillow()
        images = np.empty((len(files), 3, size, size), dtype=np.uint8)
        for i, path in enumerate(files):
            images[i] = _decode(path, size, Image)
        super().__init__(images, labels, names)
        self.root, self.split, self.files = root, split, files

    def __repr__(self):
        where = self.root / self.split if self.split is not None else self.root
        return f"ImageFolder({where}: {len(self)} images, {self.num_classes} classes)"


def subset(dataset: ImageDataset, index, keep_stats=False) -> ImageDataset:
    """The rows ``index`` of an ImageDataset, with its class names; its mean and std measured
    again on those rows, or the dataset's own with ``keep_stats`` (CIFAR's published ones)."""
    stats = (dataset.mean, dataset.std) if keep_stats else (None, None)
    return ImageDataset(dataset.images[index], dataset.labels[index], dataset.classes, *stats)


# --------------------------------------------------------------------------- arrays in an npz file
def as_images(array, what="images"):
    """(N, 3, H, W) uint8 from images in one of the accepted layouts and dtypes: (N, H, W) grey,
    (N, H, W, C) as Keras and PIL store them, or (N, C, H, W), C = 1 or 3; integer pixels in
    0..255 or floats in [0, 1]. A ValueError starting with ``what`` says what does not fit,
    including a shape that two layouts could read: one image without its batch axis ((H, W, C),
    (3, H, W)), or channels that could be first or last."""
    x = np.asarray(array)
    channels = (1, 3)
    if x.ndim == 3 and (x.shape[-1] in channels or x.shape[0] == 3):
        raise ValueError(f"{what} has shape {x.shape}: one image without its batch axis? Give images as (N, H, W, "
                         "C) or (N, C, H, W) with C = 1 or 3 (images[None] for one image), grey ones as (N, H, W) "
                         "or (N, H, W, 1)")
    if x.ndim == 4 and x.shape[1] in channels and x.shape[-1] in channels:
        raise ValueError(f"{what} has shape {x.shape}: are the channels first or last? Both axis 1 and the last "
                         "axis could be; give images whose height and width are not 1 or 3")
    if x.ndim == 3:
        x = x[:, None]                                                     # grey (N, H, W)
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)                                        # NHWC -> NCHW
    elif not (x.ndim == 4 and x.shape[1] in (1, 3)):
        raise ValueError(f"{what} has shape {x.shape}; expected images (N, H, W), (N, H, W, C) or "
                         "(N, C, H, W) with C = 1 or 3")
    if len(x) == 0:
        raise ValueError(f"{what} holds no images")
    if x.dtype == np.uint8:
        pass
    elif x.dtype != np.bool_ and np.issubdtype(x.dtype, np.integer):
        lo, hi = int(x.min()), int(x.max())
        if lo < 0 or hi > 255:
            raise ValueError(f"{what} is {x.dtype} with values in [{lo}, {hi}]; expected pixels 0..255")
        x = x.astype(np.uint8)
    elif np.issubdtype(x.dtype, np.floating):
        finite = np.isfinite(x)
        if not finite.all():
            bad = ~finite
            kinds = " and ".join(name for name, found in (("NaN", np.isnan(x).any()), ("inf", np.isinf(x).any()))
                                 if found)
            first = int(np.flatnonzero(bad.reshape(len(x), -1).any(axis=1))[0])
            raise ValueError(f"{what} holds {kinds} ({int(bad.sum()):,} values, the first in image {first}); "
                             "expected floats in [0, 1] (or uint8 pixels 0..255)")
        lo, hi = float(x.min()), float(x.max())
        if lo < 0 or hi > 1:
            raise ValueError(f"{what} is {x.dtype} with values in [{lo:g}, {hi:g}]; expected floats in "
                             "[0, 1] (or uint8 pixels 0..255)")
        x = np.rint(x * 255).astype(np.uint8)
    else:
        raise ValueError(f"{what} has dtype {x.dtype}; expected uint8 pixels (or floats in [0, 1])")
    if x.shape[1] == 1:
        x = np.repeat(x, 3, axis=1)                                        # grey -> RGB
    return x


def _images_from(array, key, path):
    try:
        return as_images(array, f"{path}: {key}")
    except ValueError as err:
        raise DatasetError(str(err)) from None


def _labels_from(array, key, path, n):
    y = np.asarray(array)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.shape != (n,):
        raise DatasetError(f"{path}: {key} has shape {y.shape}; expected ({n},), one label per image")
    if y.dtype == np.bool_ or not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            nan = " and holds NaN" if np.issubdtype(y.dtype, np.floating) and np.isnan(y).any() else ""
            raise DatasetError(f"{path}: {key} has dtype {y.dtype}{nan}; expected integer class labels")
    return y.astype(np.int64)


def _named_labels(arrays, y_train, y_test, path):
    """(classes, y_train, y_test) when the file names its classes: the labels index them."""
    classes = class_names(np.asarray(arrays["classes"]).ravel(), f"{path}: classes", "class name")
    for key, y in (("y_train", y_train), ("y_test", y_test)):
        bad = y[(y < 0) | (y >= len(classes))]
        if bad.size:
            raise DatasetError(f"{path}: {key} holds the label {int(bad[0])}, which names no class: classes holds "
                               f"{len(classes)} names (labels 0..{len(classes) - 1})")
    counts = np.bincount(y_train, minlength=len(classes))
    if not counts.all():
        k = int(np.flatnonzero(counts == 0)[0])
        raise DatasetError(f"{path}: the class {classes[k]!r} (label {k}) has no image in y_train; every class "
                           "needs training images (or leave it out of classes)")
    return classes, y_train, y_test


NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def load_npz(path, size=32):
    """(train, test) ImageDatasets from ``x_train, y_train, x_test, y_test`` (and ``classes``)."""
    size = as_count(size, "load_npz: size")
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file (expected an .npz with arrays {', '.join(NPZ_KEYS)})")
    if not zipfile.is_zipfile(path):
        raise DatasetError(f"{path}: not an .npz file (a zip of arrays, as numpy.savez writes; expected arrays "
                           f"{', '.join(NPZ_KEYS)})")
    problem = npz_problem(path)
    if problem is not None:
        raise DatasetError(f"{path}: {problem}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in NPZ_KEYS if k not in npz.files]
            if missing:
                raise DatasetError(f"{path}: no array {', '.join(missing)} "
                                   f"(it holds {', '.join(npz.files) or 'none'}); expected {', '.join(NPZ_KEYS)}")
            arrays = {k: npz[k] for k in NPZ_KEYS + (("classes",) if "classes" in npz.files else ())}
    except DatasetError:
        raise
    except ValueError as err:   # object arrays need pickle, which is refused
        raise DatasetError(f"{path}: an array needs pickle to be read, which is refused ({err}); save plain "
                           "numeric arrays (and class names as a string array)") from None
    except Exception as err:    # not a zip, truncated, ...
        raise DatasetError(f"{path}: not a readable .npz file ({type(err).__name__}: {err})") from None
    x_train = _images_from(arrays["x_train"], "x_train", path)
    x_test = _images_from(arrays["x_test"], "x_test", path)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DatasetError(f"{path}: x_train images are {x_train.shape[1:]} but x_test images {x_test.shape[1:]}")
    y_train = _labels_from(arrays["y_train"], "y_train", path, len(x_train))
    y_test = _labels_from(arrays["y_test"], "y_test", path, len(x_test))
    if "classes" in arrays:
        classes, y_train, y_test = _named_labels(arrays, y_train, y_test, path)
    else:       # numbered as a CSV file's labels are: their distinct values, sorted
        classes, y_train = number_labels(y_train.tolist(), f"{path}: y_train")
        _, y_test = number_labels(y_test.tolist(), f"{path}: y_test", classes)
    return (ImageDataset(resize_images(x_train, size), y_train, classes),
            ImageDataset(resize_images(x_test, size), y_test, classes))
