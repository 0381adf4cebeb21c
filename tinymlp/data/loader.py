"""Datasets held as arrays, and the DataLoader that turns them into batches on a device.

A dataset here is simply two arrays in host memory: ``images`` (N, 3, H, W) uint8 in NCHW
order and ``labels`` (N,) int64, plus ``classes`` (the label names) and the per-channel
``mean``/``std`` that normalisation uses. ``ImageDataset`` is that record; CIFAR10, CIFAR100
and SyntheticImages are ImageDatasets.

The DataLoader gathers a batch of uint8 images on the host, moves it to the device once (a
quarter of the bytes of float32), and does everything else there with ``xp``: conversion to
float32 in [0, 1], augmentation and normalisation. The same code therefore runs on NumPy and
on CuPy, and all randomness comes from one seeded ``numpy.random.Generator``, so a run is
reproducible (and draws the same crops and flips on either device).
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import module_for_device, parse_device, to_device
from ..tensor import Tensor

__all__ = ["DataLoader", "ImageDataset", "as_count", "as_fraction", "channel_stats", "check_range"]


def as_count(value, what, minimum=1) -> int:
    """``value`` as an int: a count (a batch size, a number of images, a size in pixels) is a whole
    number, so a float (2.9, even 3.0), a boolean or a string is refused with a TypeError naming
    ``what``, as PyTorch's DataLoader refuses them; below ``minimum``, a ValueError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be a whole number (a count), got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum}, got {value}")
    return int(value)


def as_fraction(value, what, low=0.0, high=1.0, low_ok=True, high_ok=True) -> float:
    """``value`` as a float in the interval from ``low`` to ``high`` (each end included when its
    ``_ok``): a probability, a share, a mixing weight. Anything else is a ValueError (a TypeError
    for a non-number or a boolean) naming ``what`` and the interval."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {value!r} of type {type(value).__name__}")
    value = float(value)
    inside = ((low < value or (low_ok and value == low)) and (value < high or (high_ok and value == high)))
    if not inside:
        interval = f"{'[' if low_ok else '('}{low:g}, {high:g}{']' if high_ok else ')'}"
        raise ValueError(f"{what} must be in {interval}, got {value:g}")
    return value


def check_range(loader, what, values, high, rows, fix):
    """Raise a ValueError when an integer of the host array ``values`` lies outside [0, ``high``)
    (``high`` None: only negatives are refused), naming ``loader``, ``what``, the first bad value
    and its dataset row (``rows[i]`` is the dataset row of ``values[i]``), and ``fix``.

    The loaders check labels and token ids here, on the host, batch by batch: the losses and
    the embedding check them only on the CPU, because on a GPU reading them back would stall
    every step, and a GPU gather with an out-of-range index wraps around or reads garbage
    without an error."""
    if not values.size:
        return
    bad = values < 0 if high is None else (values < 0) | (values >= high)
    if bad.any():
        where = np.flatnonzero(bad.reshape(len(values), -1).any(axis=1))[0]
        value = values[where].reshape(-1)[bad[where].reshape(-1)][0]
        limit = "not negative" if high is None else f"in [0, {high})"
        raise ValueError(f"{loader}: {what} {int(value)} in dataset row {int(rows[where])} must be {limit}; {fix}")


def channel_stats(images):
    """Per-channel mean and std of uint8 images (N, C, H, W), on the [0, 1] scale.

    Exact and cheap: a 256-bin histogram per channel, then mean = sum(v n_v) / N and
    var = sum(v^2 n_v) / N - mean^2 over the pixel values v with counts n_v.
    """
    values = np.arange(256, dtype=np.float64) / 255
    mean, std = [], []
    for c in range(images.shape[1]):
        counts = np.bincount(images[:, c].ravel(), minlength=256)
        m = counts @ values / counts.sum()
        mean.append(float(m))
        std.append(float(np.sqrt(max(counts @ (values * values) / counts.sum() - m * m, 0.0))))
    return tuple(mean), tuple(std)


class ImageDataset:
    """Images (N, C, H, W) uint8, labels (N,) int64 and the names of the classes.

    ``dataset[i]`` is ``(image, label)`` with image (C, H, W) uint8 and label an int.
    ``mean`` and ``std`` are per-channel statistics of the pixels scaled to [0, 1], the
    constants ``Normalize`` wants; when not given they are measured on ``images``.
    """

    def __init__(self, images, labels, classes, mean=None, std=None):
        images = np.asarray(images)
        labels = np.asarray(labels, dtype=np.int64)
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(
                f"images must be a uint8 array of shape (N, C, H, W), got {images.dtype} {images.shape}"
            )
        if labels.shape != (len(images),):
            raise ValueError(f"labels must have shape ({len(images)},), got {labels.shape}")
        self.images = images
        self.labels = labels
        self.classes = tuple(classes)
        if mean is None or std is None:
            mean, std = channel_stats(images)
        self.mean = tuple(mean)
        self.std = tuple(std)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], int(self.labels[index])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} images, {self.num_classes} classes)"


class DataLoader:
    """Iterate over ``dataset`` in batches of ``(images, labels)`` Tensors on ``device``.

    - ``images``: float32 (B, C, H, W), pixel values scaled to [0, 1], then passed through
      ``transform`` (augmentation, normalisation) on the device.
    - ``labels``: int64 (B,) class ids, or float (B, K) soft targets when the transform
      mixes images (Mixup, CutMix).

    ``rng`` (a numpy Generator or an int seed; None means seed 0) drives both the shuffling
    and the transform, so two loaders built with the same seed yield the same batches, epoch
    after epoch. The generator is ``loader.rng``: save ``loader.rng.bit_generator.state`` to
    resume a run exactly. ``transform(images, labels, rng) -> (images, labels)`` receives xp
    arrays (see ``tinymlp.data.transforms``).

    ``len(loader)`` is the number of batches per epoch: the last, smaller batch counts
    unless ``drop_last``.
    """

    def __init__(self, dataset, batch_size, shuffle=False, drop_last=False, rng=None,
                 transform=None, device="cpu"):
        self.dataset = dataset
        self.batch_size = as_count(batch_size, "DataLoader: batch_size")
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(
            0 if rng is None else rng)
        self.transform = transform
        self.device = parse_device(device)
        module_for_device(self.device)  # fail now, clearly, if the device is unusable

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _gather(self, index):
        """Host arrays (images uint8, labels int64) for the dataset rows in ``index``."""
        images = getattr(self.dataset, "images", None)
        labels = getattr(self.dataset, "labels", None)
        if images is not None and labels is not None:
            return images[index], labels[index]
        pairs = [self.dataset[int(i)] for i in index]  # any indexable (image, label) dataset
        return np.stack([p[0] for p in pairs]), np.asarray([p[1] for p in pairs], dtype=np.int64)

    def __iter__(self):
        n = len(self.dataset)
        order = self.rng.permutation(n) if self.shuffle else np.arange(n)
        for b in range(len(self)):
            index = order[b * self.batch_size:(b + 1) * self.batch_size]
            images, labels = self._gather(index)
            labels = np.asarray(labels)
            if labels.ndim == 1:                                  # class ids (not soft targets)
                classes = getattr(self.dataset, "classes", None)
                check_range("DataLoader", "label", labels, len(classes) if classes else None, index,
                            f"the dataset has {len(classes)} classes" if classes
                            else "labels are class ids counted from 0")
            images = to_device(np.ascontiguousarray(images), self.device)  # uint8: 1 byte a pixel
            labels = to_device(np.asarray(labels, dtype=np.int64), self.device)
            x = images.astype(np.float32)
            x *= np.float32(1 / 255)
            if self.transform is not None:
                x, labels = self.transform(x, labels, self.rng)
            yield Tensor(x), Tensor(labels)

    def __repr__(self) -> str:
        return (f"DataLoader({self.dataset!r}, batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"drop_last={self.drop_last}, transform={self.transform!r}, device='{self.device}')")
