"""A procedurally generated CIFAR-format image set whose classes are spatial arrangements.

Every image is a 4 x 4 grid of 8 x 8 cells (so 32 x 32 x 3, uint8, NCHW, like CIFAR). Fourteen
cells hold distractor textures (stripes, checkers, diagonals, discs, flat colour) in random
colours; two cells hold the markers:

- marker A, a reddish cross on a dark background,
- marker B, a bluish hollow square on a dark background.

Both markers are in every image, in different rows, so the colour statistics and the set of
shapes do not depend on the class. The class says only where B sits relative to A::

    class = 2 * h + v,   h = clip(col_B - col_A, -2, 2) + 2,   v = 1 if row_B > row_A else 0

h: B is far left (h=0, two or more columns), just left, in the same column, just right, or far
right (h=4) of A; v: B is above (0) or below (1) A. A model that pools what it sees in each
patch without relating positions (a Mixer with its token mixing removed) stays at chance: it
has to relate the positions of two patches, which is what token mixing (Mixer), spatial
gating (gMLP) or attention is for. Colour jitter, texture
distractors and pixel noise keep it from being trivial; a small Mixer still learns it in
seconds on a CPU, which makes it the set for offline demos, lessons and learning tests.

Classes are exactly balanced (for a multiple of 10 images), and the set is a pure function of
``(num_images, seed, train)``: ``train=False`` draws from a different random stream than
``train=True`` with the same seed. 10,000 images take well under a second.
"""

from __future__ import annotations

import numpy as np

from .loader import ImageDataset, as_count, as_fraction

__all__ = ["SyntheticImages"]

GRID = 4                 # cells per side
CELL = 8                 # pixels per cell side
NUM_CLASSES = 10
CLASS_NAMES = tuple(
    f"B {side} of A, {vert}"
    for side in ("far left", "left", "same column", "right", "far right")
    for vert in ("above", "below")
)


def _cell_shapes():
    """The 8 x 8 masks in [0, 1]: distractor textures first, then marker A, then marker B."""
    y, x = np.mgrid[0:CELL, 0:CELL]
    r2 = (y - 3.5) ** 2 + (x - 3.5) ** 2
    distractors = [
        (y // 2) % 2,                    # horizontal stripes
        (x // 2) % 2,                    # vertical stripes
        (y // 2 + x // 2) % 2,           # checkerboard
        ((x + y) // 2) % 2,              # diagonal stripes
        ((x - y) // 2) % 2,              # anti-diagonal stripes
        r2 <= 9,                         # disc
        np.zeros_like(y),                # flat colour
    ]
    cross = (abs(y - 3.5) < 1.5) | (abs(x - 3.5) < 1.5)
    hollow_square = np.minimum(np.minimum(y, x), np.minimum(7 - y, 7 - x)) < 2
    return np.stack(distractors + [cross, hollow_square]).astype(np.float32)


SHAPES = _cell_shapes()
MARKER_A, MARKER_B = len(SHAPES) - 2, len(SHAPES) - 1
COLOUR_A = np.array([0.85, 0.15, 0.15], dtype=np.float32)
COLOUR_B = np.array([0.15, 0.35, 0.90], dtype=np.float32)


def arrangement_class(cell_a, cell_b):
    """The class of an image whose markers A and B sit in grid cells ``cell_a``, ``cell_b``
    (row-major indices 0..15; arrays work too). Markers in the same row have no class (-1)."""
    row_a, col_a = np.divmod(np.asarray(cell_a), GRID)
    row_b, col_b = np.divmod(np.asarray(cell_b), GRID)
    h = np.clip(col_b - col_a, -2, 2) + 2
    v = (row_b > row_a).astype(np.int64)
    return np.where(row_a == row_b, -1, 2 * h + v)


def _pairs_by_class():
    """For each class, every (cell_a, cell_b) placement that produces it: (10, max, 2), counts."""
    a, b = np.divmod(np.arange(GRID**4), GRID**2)
    label = arrangement_class(a, b)
    lists = [np.stack([a[label == k], b[label == k]], axis=1) for k in range(NUM_CLASSES)]
    counts = np.array([len(p) for p in lists])
    table = np.zeros((NUM_CLASSES, counts.max(), 2), dtype=np.int64)
    for k, p in enumerate(lists):
        table[k, :len(p)] = p
    return table, counts


PAIRS, PAIR_COUNTS = _pairs_by_class()


def _per_cell(colours):
    """(n, 16, 3) colours per cell -> a view (n, 3, 4, 1, 4, 1) that broadcasts over the grid layout."""
    n = len(colours)
    return colours.reshape(n, GRID, GRID, 3).transpose(0, 3, 1, 2)[:, :, :, None, :, None]


class SyntheticImages(ImageDataset):
    """``num_images`` generated images, labels and class names (see the module docstring).

    Parameters: ``num_images`` (default 10,000), ``seed``, ``train`` (train and test sets of
    one seed come from different random streams), ``noise`` (half-width of the uniform pixel
    noise, in units of the [0, 1] pixel range). Besides ``images``, ``labels``, ``classes``, ``mean``
    and ``std``, ``markers`` (N, 2) holds the grid cells of markers A and B in each image.
    """

    def __init__(self, num_images=10_000, seed=0, train=True, noise=0.15):
        n = as_count(num_images, "SyntheticImages: num_images")
        seed = as_count(seed, "SyntheticImages: seed", minimum=0)
        noise = as_fraction(noise, "SyntheticImages: noise", 0.0, 1.0)
        rng = np.random.default_rng([seed, 0 if train else 1])
        labels = rng.permutation(np.arange(n) % NUM_CLASSES)

        # where the markers go: a placement drawn uniformly among those of the image's class
        choice = (rng.random(n) * PAIR_COUNTS[labels]).astype(np.int64)
        markers = PAIRS[labels, choice]                                   # (n, 2)

        # what each cell shows: a random distractor, except the two marker cells
        cells = GRID * GRID
        shape = rng.integers(0, MARKER_A, size=(n, cells))
        fg = rng.uniform(0.1, 0.9, size=(n, cells, 3)).astype(np.float32)
        bg = rng.uniform(0.1, 0.9, size=(n, cells, 3)).astype(np.float32)
        rows = np.arange(n)
        shape[rows, markers[:, 0]] = MARKER_A
        shape[rows, markers[:, 1]] = MARKER_B
        jitter = rng.uniform(-0.1, 0.1, size=(n, 2, 3)).astype(np.float32)
        fg[rows, markers[:, 0]] = COLOUR_A + jitter[:, 0]
        fg[rows, markers[:, 1]] = COLOUR_B + jitter[:, 1]
        dark = rng.uniform(0.0, 0.15, size=(n, 2, 3)).astype(np.float32)
        bg[rows, markers[:, 0]] = dark[:, 0]                              # markers stand out on
        bg[rows, markers[:, 1]] = dark[:, 1]                              # a dark background

        # paint, straight into the grid layout (n, 3, grid row, y, grid col, x), in 0..255 units:
        # pixel = bg + mask * (fg - bg) + uniform noise in [-noise, noise], rounded
        fg -= bg
        fg *= 255
        bg *= 255
        bg += 0.5 - 255 * noise                                            # rounding, noise offset
        mask = SHAPES[shape].reshape(n, GRID, GRID, CELL, CELL).transpose(0, 1, 3, 2, 4)
        pixels = np.empty((n, 3, GRID, CELL, GRID, CELL), dtype=np.float32)
        np.multiply(mask[:, None], _per_cell(fg), out=pixels)
        pixels += _per_cell(bg)
        if noise:
            grain = rng.random(pixels.shape, dtype=np.float32)
            grain *= np.float32(2 * 255 * noise)
            pixels += grain
        pixels = pixels.reshape(n, 3, GRID * CELL, GRID * CELL)
        images = np.clip(pixels, 0, 255, out=pixels).astype(np.uint8)

        super().__init__(images, labels, CLASS_NAMES)
        self.markers = markers
        self.seed, self.train, self.noise = seed, train, noise

    def __repr__(self) -> str:
        split = "train" if self.train else "test"
        return f"SyntheticImages({split}, {len(self)} images, {self.num_classes} classes, seed={self.seed})"
