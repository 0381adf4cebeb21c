"""Plots with matplotlib, headless: training curves and images of learned token-mixing weights.

    training_curves(history, "run/curves.png")           loss and accuracy per epoch
    token_mixing_weights(mixer, "run/token_mixing.png")  Mixer: each token-MLP unit on the patch grid
    spatial_weights(gmlp, "run/spatial_weights.png")     gMLP: each block's S x S spatial matrix

Each function returns the ``matplotlib.figure.Figure`` and, given a ``path``, also saves it as
a PNG. Figures are built with ``matplotlib.figure.Figure`` directly, not through ``pyplot``:
no GUI backend is touched (it works on a server without a display) and pyplot keeps no
reference to them, so nothing leaks when many are made. In Jupyter, a returned Figure
displays as the cell's output.

What the weight pictures show. A Mixer's token-mixing MLP reads each channel as a vector of
S = gh * gw numbers, one per patch; the first layer's weight is (S, D_S), so column j is what
hidden unit j looks for *across the image*. Reshaped to the gh x gw patch grid, the columns
become little pictures: after training on images they look like local blobs, edges and
periodic patterns (the MLP-Mixer paper's Figure 5). gMLP's spatial gating unit mixes tokens
with one S x S matrix W per block; row i holds the weights token i gives to every token, so
row i reshaped to the grid is token i's "receptive field". Training tends to make W
Toeplitz-like (each row a shifted copy of the same local pattern), which the course work
notes and the ``toeplitz`` option builds in.
"""

from __future__ import annotations

import math
import os

import numpy as np

from .backend import to_device
from .tensor import Tensor

__all__ = ["spatial_weights", "token_mixing_weights", "training_curves"]

_CMAP = "RdBu_r"     # diverging: negative blue, zero white, positive red


def _figure(width, height):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig, path):
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fig.savefig(path, dpi=fig.dpi)
    return fig


def _numpy(x) -> np.ndarray:
    """A Tensor or array (NumPy or CuPy) as a float64 NumPy array, outside any graph."""
    if isinstance(x, Tensor):
        x = x.data
    return np.asarray(to_device(x, "cpu"), dtype=np.float64)


def _grid_of(model, num_tokens):
    """(gh, gw) of the patch grid: the model's patch embedding says, else a square grid."""
    grid = getattr(getattr(model, "patch_embed", None), "grid", None)
    if grid is not None:
        return tuple(int(g) for g in grid)
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise ValueError(f"{num_tokens} tokens do not form a square patch grid; pass grid=(gh, gw)")
    return side, side


# ---------------------------------------------------------------------- training curves
def training_curves(history, path=None, title=None):
    """Loss (left) and accuracy (right) per epoch, training and validation; a Figure.

    ``history`` is a ``tinymlp.train.History`` or its ``to_dict()`` form (e.g. read back from
    ``metrics.json``). Validation curves are drawn when there are validation values.
    """
    h = history.to_dict() if hasattr(history, "to_dict") else history
    epochs = h["epoch"]
    fig = _figure(9, 3.6)
    ax_loss, ax_acc = fig.subplots(1, 2)
    for ax, key, label in ((ax_loss, "loss", "loss"), (ax_acc, "acc", "accuracy (%)")):
        scale = 100 if key == "acc" else 1
        ax.plot(epochs, [scale * v for v in h[f"train_{key}"]], "o-", ms=3, label="train")
        val = [(e, scale * v) for e, v in zip(epochs, h[f"val_{key}"]) if v is not None]
        if val:
            ax.plot(*zip(*val), "o-", ms=3, label="validation")
        ax.set_xlabel("epoch")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    if epochs:
        from matplotlib.ticker import MaxNLocator

        for ax in (ax_loss, ax_acc):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        fig.suptitle(title)
    return _save(fig, path)


# ---------------------------------------------------------------------- mosaics
def _mosaic(tiles, cols, normalise=True):
    """Tiles (n, h, w) laid out in ``cols`` columns with a one-pixel NaN gap: one image to show.

    With ``normalise`` each tile is divided by its largest absolute value, so each shows its
    own pattern in [-1, 1] (the scales of different units are not comparable anyway).
    """
    n, th, tw = tiles.shape
    if normalise:
        peak = np.abs(tiles).reshape(n, -1).max(axis=1)
        tiles = tiles / np.where(peak > 0, peak, 1.0)[:, None, None]
    rows = math.ceil(n / cols)
    out = np.full((rows * (th + 1) - 1, cols * (tw + 1) - 1), np.nan)
    for k in range(n):
        r, c = divmod(k, cols)
        out[r * (th + 1):r * (th + 1) + th, c * (tw + 1):c * (tw + 1) + tw] = tiles[k]
    return out


def _show(ax, image, vmax=None, title=None):
    import matplotlib

    cmap = matplotlib.colormaps[_CMAP].with_extremes(bad="0.85")   # gaps between tiles: light grey
    vmax = vmax if vmax is not None else (np.nanmax(np.abs(image)) or 1.0)
    im = ax.imshow(image, cmap=cmap, vmin=-vmax, vmax=vmax, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)
    return im


# ---------------------------------------------------------------------- Mixer token mixing
def token_mixing_weights(model, path=None, block=0, max_units=None, cols=None, grid=None):
    """The first token-mixing layer of Mixer block ``block``: one small image per hidden unit.

    ``model`` is an MLPMixer, a MixerBlock, or the weight itself (S, D_S) (Tensor or array;
    then ``grid`` or a square grid gives the layout). Column j of ``token_mlp.fc1.weight`` holds
    unit j's S weights, one per patch; it is drawn on the gh x gw patch grid, scaled to its own
    largest magnitude (red positive, blue negative). ``max_units`` draws only the first units.
    """
    if hasattr(model, "blocks"):
        weight = model.blocks[block].token_mlp.fc1.weight
    elif hasattr(model, "token_mlp"):
        weight = model.token_mlp.fc1.weight
    else:
        weight = model
    w = _numpy(weight)                                       # (S, D_S)
    if w.ndim != 2:
        raise ValueError(f"token_mixing_weights: expected a (tokens, hidden) weight, got shape {w.shape}")
    S, units = w.shape
    gh, gw = tuple(grid) if grid is not None else _grid_of(model, S)
    if gh * gw != S:
        raise ValueError(f"token_mixing_weights: grid {gh}x{gw} does not hold {S} tokens")
    if max_units is not None:
        units = min(units, int(max_units))
    tiles = w[:, :units].T.reshape(units, gh, gw)
    cols = cols or math.ceil(math.sqrt(units))
    rows = math.ceil(units / cols)
    fig = _figure(max(3.0, 0.55 * cols + 0.5), max(2.5, 0.55 * rows + 0.8))
    ax = fig.subplots()
    _show(ax, _mosaic(tiles, cols), vmax=1.0)
    ax.set_title(f"token-mixing weights, block {block}: {units} hidden units on the {gh}x{gw} patch grid",
                 fontsize=9)
    return _save(fig, path)


# ---------------------------------------------------------------------- gMLP spatial weights
def _spatial_matrices(model_or_weight):
    """[(label, (S, S) array)] from a GMLP/AMLP, a block, an SGU, or weight(s) given directly."""
    from .autograd import no_grad

    obj = model_or_weight
    with no_grad():                                          # Toeplitz weights are built by an op
        if hasattr(obj, "blocks"):
            if not all(hasattr(b, "sgu") for b in obj.blocks):
                raise TypeError(f"spatial_weights: {type(obj).__name__} has no spatial gating units "
                                "(a gMLP or aMLP has; for a Mixer use token_mixing_weights)")
            return [(f"block {i}", _numpy(b.sgu.spatial_weight())) for i, b in enumerate(obj.blocks)]
        if hasattr(obj, "sgu"):
            return [("spatial weight", _numpy(obj.sgu.spatial_weight()))]
        if hasattr(obj, "spatial_weight"):
            return [("spatial weight", _numpy(obj.spatial_weight()))]
    w = _numpy(obj)
    if w.ndim == 2:
        return [("spatial weight", w)]
    if w.ndim == 3:
        return [(f"block {i}", m) for i, m in enumerate(w)]
    raise ValueError(f"spatial_weights: expected (S, S) or (L, S, S) weights, got shape {w.shape}")


def spatial_weights(model_or_weight, path=None, grid=None, token=None):
    """gMLP's spatial gating weights W (S x S), one column of panels per block.

    Top row: the matrix W itself (row i = the weights token i gives every token). Bottom row,
    when the tokens form a patch grid: the row of token ``token`` (default: the centre of the
    grid) reshaped to the grid, i.e. where that token gathers its gate from. Each panel has
    its own symmetric colour scale (red positive, blue negative).

    ``model_or_weight``: a GMLP/AMLP (all blocks), a GMLPBlock or SpatialGatingUnit, or
    the weights themselves, (S, S) or (L, S, S). ``grid`` (gh, gw) overrides the layout the
    model's patch embedding (or a square number of tokens) gives.
    """
    mats = _spatial_matrices(model_or_weight)
    S = mats[0][1].shape[0]
    if grid is None:
        try:
            grid = _grid_of(model_or_weight, S)
        except ValueError:
            grid = None                                      # no grid: only the matrices
    gh, gw = grid if grid is not None else (None, None)
    if token is None and grid is not None:
        token = (gh // 2) * gw + gw // 2                     # the centre patch, row-major
    n = len(mats)
    panel_rows = 2 if grid is not None else 1
    fig = _figure(max(3.0, 2.2 * n), 2.3 * panel_rows + 0.3)
    axes = np.asarray(fig.subplots(panel_rows, n, squeeze=False))
    for k, (label, w) in enumerate(mats):
        _show(axes[0, k], w, title=label)
        if grid is not None:
            _show(axes[1, k], w[token].reshape(gh, gw), title=f"row of token {token}")
    if grid is not None:
        axes[0, 0].set_ylabel("W (S x S)", fontsize=9)
        axes[1, 0].set_ylabel(f"on the {gh}x{gw} grid", fontsize=9)
    fig.suptitle("spatial gating weights", fontsize=10)
    return _save(fig, path)
