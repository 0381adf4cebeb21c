"""Batch augmentations and normalisation, vectorised over the batch, on NumPy or CuPy.

Each function works on a whole batch at once (no Python loop over images) through
``xp = array_module(images)``, so the DataLoader runs them on the device the batch is on.
Random choices are drawn from a ``numpy.random.Generator`` (a few numbers per image, cheap
on the host) and copied to the device: one seed gives the same augmentation on either device.

Two layers, as in ``F`` and ``nn``:

- functions that do the work: ``random_crop(images, pad, rng)``, ``horizontal_flip(images,
  rng)``, ``normalize(images, mean, std)``, ``resize(images, size)``, ``mixup(...)``,
  ``cutmix(...)``, ``one_hot(...)``;
- transform objects that hold the parameters and share one call signature,
  ``transform(images, labels, rng) -> (images, labels)``: ``RandomCrop``, ``HorizontalFlip``,
  ``Normalize``, ``Resize``, ``Mixup``, ``CutMix``, chained with ``Compose``.

Images are float (B, C, H, W) (the DataLoader hands over float32 in [0, 1]); crop and flip
also accept uint8. The CIFAR recipe is ``Compose([RandomCrop(4), HorizontalFlip(),
Normalize(dataset.mean, dataset.std)])`` for training and ``Normalize(...)`` alone for testing.
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import array_module, device_constant
from .loader import as_count, as_fraction

__all__ = [
    "CutMix", "Compose", "HorizontalFlip", "Mixup", "Normalize", "RandomCrop", "Resize",
    "cutmix", "horizontal_flip", "mixup", "normalize", "one_hot", "random_crop", "resize",
]


# --------------------------------------------------------------------------- functions
def random_crop(images, pad, rng):
    """Pad each image with ``pad`` zero pixels on every side, then crop it back to H x W at an
    offset drawn uniformly per image: a random shift by (dy, dx) in [-pad, pad]^2 with zeros
    filling the border uncovered by the shift.

    No copy per offset: a strided view of the padded batch, shape
    (B, C, 2 pad + 1, 2 pad + 1, H, W), holds every possible crop, and one gather picks
    crop (oy[b], ox[b]) for each image b. The view is built from the padded batch's strides
    alone (``as_strided``), with no check that would read device values back to the host.
    """
    if pad == 0:
        return images
    xp = array_module(images)
    B, C, H, W = images.shape
    padded = xp.zeros((B, C, H + 2 * pad, W + 2 * pad), dtype=images.dtype)
    padded[:, :, pad:pad + H, pad:pad + W] = images
    sb, sc, sh, sw = padded.strides
    crops = xp.lib.stride_tricks.as_strided(padded, shape=(B, C, 2 * pad + 1, 2 * pad + 1, H, W),
                                            strides=(sb, sc, sh, sw, sh, sw))
    oy = xp.asarray(rng.integers(0, 2 * pad + 1, size=B))
    ox = xp.asarray(rng.integers(0, 2 * pad + 1, size=B))
    return crops[xp.arange(B), :, oy, ox]                                 # (B, C, H, W)


def horizontal_flip(images, rng, p=0.5):
    """Mirror each image left-right with probability ``p`` (drawn per image)."""
    xp = array_module(images)
    flip = xp.asarray(rng.random(len(images)) < p)
    return xp.where(flip[:, None, None, None], images[..., ::-1], images)


def normalize(images, mean, std):
    """Per-channel standardisation: (x - mean[c]) / std[c], in the dtype of ``images``."""
    xp = array_module(images)
    shape = (1, -1) + (1,) * (images.ndim - 2)
    dtype = np.dtype(images.dtype)
    if (isinstance(mean, (np.ndarray, list, tuple, int, float))
            and isinstance(std, (np.ndarray, list, tuple, int, float))):
        key = ("normalize", dtype.str, np.asarray(mean, np.float64).tobytes(), np.asarray(std, np.float64).tobytes())
        mean = device_constant(xp, key + ("mean",), lambda: np.asarray(mean, dtype=dtype).reshape(shape))
        inv_std = device_constant(xp, key + ("1/std",), lambda: 1 / np.asarray(std, dtype=dtype).reshape(shape))
    else:                                                    # statistics already on the device
        mean = xp.asarray(mean, dtype=images.dtype).reshape(shape)
        inv_std = 1 / xp.asarray(std, dtype=images.dtype).reshape(shape)
    out = images - mean
    out *= inv_std
    return out


def _bilinear_weights(n_in, n_out):
    """(n_out, n_in) matrix R such that R @ v resamples v bilinearly to n_out points.

    Half-pixel centres: output sample o sits at input coordinate (o + 1/2) n_in / n_out - 1/2,
    clamped to [0, n_in - 1], and takes (1 - t) v[i] + t v[i + 1] from its two neighbours
    (i its floor, t the fraction). The same grid as PyTorch's ``interpolate(mode="bilinear",
    align_corners=False)`` without antialiasing.
    """
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    t = src - lo
    weights = np.zeros((n_out, n_in))
    np.add.at(weights, (np.arange(n_out), lo), 1 - t)
    np.add.at(weights, (np.arange(n_out), hi), t)
    return weights


def resize(images, size):
    """Bilinear resize of float images (..., H, W) to ``size`` (an int or (h, w)), on their device.

    Bilinear interpolation is separable, a weighted average along rows then along columns, so
    it is two matrix products with small interpolation matrices: out = R_h @ images @ R_w^T,
    R_h (h, H) and R_w (w, W) (see ``_bilinear_weights``). The first is batched over the
    leading axes; the second, which writes the large output, is one (N h, W) x (W, w) product.
    """
    h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    H, W = images.shape[-2:]
    if (h, w) == (H, W):
        return images
    xp = array_module(images)
    dtype = np.dtype(images.dtype)                                    # uploaded once per size:
    rows = device_constant(xp, ("resize", H, h, dtype.str),
                           lambda: _bilinear_weights(H, h).astype(dtype))           # (h, H)
    cols = device_constant(xp, ("resize_T", W, w, dtype.str),
                           lambda: np.ascontiguousarray(_bilinear_weights(W, w).T, dtype=dtype))  # (W, w)
    tall = xp.matmul(rows, images)                                    # (..., h, W): along the height
    out = tall.reshape(-1, W) @ cols                                  # (... h, w): along the width
    return out.reshape(*images.shape[:-2], h, w)


def one_hot(labels, num_classes, dtype=np.float32):
    """(B,) integer class ids -> (B, K) rows of the identity; (B, K) soft targets pass through."""
    xp = array_module(labels)
    if labels.ndim == 2:
        return labels.astype(dtype, copy=False)
    if num_classes is None:
        raise ValueError("one_hot needs num_classes to turn class ids into soft targets")
    return xp.eye(num_classes, dtype=dtype)[labels]


def mixup(images, labels, alpha, num_classes, rng):
    """Mixup (Zhang et al., 2018): blend the batch with a shuffled copy of itself.

    lam ~ Beta(alpha, alpha), one per batch; x' = lam x + (1 - lam) x[perm] and the targets
    mix the same way, y' = lam onehot(y) + (1 - lam) onehot(y[perm]), so each row of y' sums to 1.
    Returns (images, soft targets (B, K)) in the dtype of ``images``.
    """
    xp = array_module(images)
    lam = float(rng.beta(alpha, alpha))
    perm = xp.asarray(rng.permutation(len(images)))
    targets = one_hot(labels, num_classes, images.dtype)
    mixed = images * images.dtype.type(lam)
    mixed += images[perm] * images.dtype.type(1 - lam)
    soft = targets * targets.dtype.type(lam)
    soft += targets[perm] * targets.dtype.type(1 - lam)
    return mixed, soft


def cutmix(images, labels, alpha, num_classes, rng):
    """CutMix (Yun et al., 2019): paste one random box from a shuffled copy of the batch.

    lam ~ Beta(alpha, alpha); the box has sides H sqrt(1 - lam) x W sqrt(1 - lam) around a
    uniform random centre, clipped to the image. The targets mix by the area actually pasted:
    y' = (1 - a) onehot(y) + a onehot(y[perm]) with a = box area / (H W).
    """
    xp = array_module(images)
    B, _, H, W = images.shape
    lam = float(rng.beta(alpha, alpha))
    perm = xp.asarray(rng.permutation(B))
    cut_h, cut_w = int(H * math.sqrt(1 - lam)), int(W * math.sqrt(1 - lam))
    cy, cx = int(rng.integers(H)), int(rng.integers(W))
    y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h - cut_h // 2, H)
    x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w - cut_w // 2, W)
    mixed = images.copy()
    mixed[:, :, y0:y1, x0:x1] = images[perm, :, y0:y1, x0:x1]
    area = (y1 - y0) * (x1 - x0) / (H * W)
    targets = one_hot(labels, num_classes, images.dtype)
    soft = targets * targets.dtype.type(1 - area)
    soft += targets[perm] * targets.dtype.type(area)
    return mixed, soft


# --------------------------------------------------------------------------- transform objects
class RandomCrop:
    """Random shift by up to ``pad`` pixels with zero padding (see ``random_crop``)."""

    def __init__(self, pad=4):
        self.pad = as_count(pad, "RandomCrop: pad", minimum=0)

    def __call__(self, images, labels, rng):
        return random_crop(images, self.pad, rng), labels

    def __repr__(self):
        return f"RandomCrop(pad={self.pad})"


class HorizontalFlip:
    """Left-right mirror with probability ``p`` per image."""

    def __init__(self, p=0.5):
        self.p = as_fraction(p, "HorizontalFlip: p")

    def __call__(self, images, labels, rng):
        return horizontal_flip(images, rng, self.p), labels

    def __repr__(self):
        return f"HorizontalFlip(p={self.p})"


class Normalize:
    """Per-channel (x - mean) / std; use the dataset's ``mean`` and ``std``."""

    def __init__(self, mean, std):
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"Normalize needs one mean and one positive std per channel, "
                             f"got mean={self.mean}, std={self.std}")

    def __call__(self, images, labels, rng):
        return normalize(images, self.mean, self.std), labels

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std})"


class Resize:
    """Bilinear resize to ``size`` (e.g. CIFAR's 32 x 32 up to a pretrained model's 224 x 224)."""

    def __init__(self, size):
        sizes = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
        self.size = tuple(as_count(s, "Resize: size") for s in sizes)

    def __call__(self, images, labels, rng):
        return resize(images, self.size), labels

    def __repr__(self):
        return f"Resize(size={self.size})"


class Mixup:
    """Mixup with Beta(alpha, alpha) weights; labels become soft targets (B, num_classes)."""

    def __init__(self, alpha, num_classes):
        self.alpha = as_fraction(alpha, f"{type(self).__name__}: alpha", 0.0, float("inf"), low_ok=False, high_ok=False)
        self.num_classes = as_count(num_classes, f"{type(self).__name__}: num_classes", minimum=2)

    def __call__(self, images, labels, rng):
        return mixup(images, labels, self.alpha, self.num_classes, rng)

    def __repr__(self):
        return f"Mixup(alpha={self.alpha}, num_classes={self.num_classes})"


class CutMix:
    """CutMix with Beta(alpha, alpha) box sizes; labels become soft targets (B, num_classes)."""

    def __init__(self, alpha, num_classes):
        self.alpha = as_fraction(alpha, f"{type(self).__name__}: alpha", 0.0, float("inf"), low_ok=False, high_ok=False)
        self.num_classes = as_count(num_classes, f"{type(self).__name__}: num_classes", minimum=2)

    def __call__(self, images, labels, rng):
        return cutmix(images, labels, self.alpha, self.num_classes, rng)

    def __repr__(self):
        return f"CutMix(alpha={self.alpha}, num_classes={self.num_classes})"


class Compose:
    """Apply transforms in order: ``Compose([RandomCrop(4), HorizontalFlip(), Normalize(m, s)])``."""

    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, images, labels, rng):
        for t in self.transforms:
            images, labels = t(images, labels, rng)
        return images, labels

    def __repr__(self):
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"
