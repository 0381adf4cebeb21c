"""Plots with matplotlib, headless: training curves and images of learned token-mixing weights.

    training_curves(history, "run/curves.png")           loss and accuracy per epoch
    confusion_matrix(labels, predicted, classes, "run/confusion.png")   test results by class name
    token_mixing_weights(mixer, "run/token_mixing.png")  Mixer: each token-MLP unit on the patch grid
    spatial_weights(gmlp, "run/spatial_weights.png")     gMLP: each block's S x S spatial matrix
    graph(loss, "run/graph.png")                         the autograd graph behind a tensor
    to_dot(loss)                                         the same graph as Graphviz DOT text

Each function returns the ``matplotlib.figure.Figure`` and, given a ``path``, also saves it as
a PNG. Figures are built with ``matplotlib.figure.Figure`` directly, not through ``pyplot``:
no GUI backend is touched (it works on a server without a display) and pyplot keeps no
reference to them, so nothing leaks when many are made. In a Jupyter notebook they show as
pyplot's figures do there, whether or not pyplot was imported: a figure a cell returns is its
output, and one a cell only makes (``plot.graph(y); print(...)``, a loop, ``fig = ...``) is shown
when the cell ends, each once (``NotebookFigure``).

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

import contextlib
import functools
import io
import math
import os
import sys

import numpy as np

from .graph import nodes as graph_nodes, parents as graph_parents
from .backend import to_device
from .files import atomic_write
from .tensor import Tensor

__all__ = ["confusion_matrix", "graph", "notebook_figure_class", "spatial_weights", "to_dot", "token_mixing_weights",
           "training_curves"]

_CMAP = "RdBu_r"     # diverging: negative blue, zero white, positive red


def _figure(width, height):
    fig = notebook_figure_class()(figsize=(width, height), layout="constrained")
    _show_at_cell_end(fig)
    return fig


# ---------------------------------------------------------------------- in a notebook
@functools.lru_cache(maxsize=1)
def notebook_figure_class():
    """``NotebookFigure``: a matplotlib Figure that displays itself as a PNG in IPython, through
    ``_ipython_display_`` (which IPython asks before any formatter, so the picture appears once
    whether or not pyplot's inline backend is active). Built on first use: importing tinymlp.plot
    does not import matplotlib."""
    from matplotlib.figure import Figure

    class NotebookFigure(Figure):
        def _ipython_display_(self):
            from IPython.display import display

            self._tinymlp_shown = True
            display({"image/png": self._repr_png_(), "text/plain": repr(self)}, raw=True)

        def _repr_png_(self):
            buffer = io.BytesIO()
            self.savefig(buffer, format="png", dpi=self.dpi)
            return buffer.getvalue()

    NotebookFigure.__module__, NotebookFigure.__qualname__ = __name__, "NotebookFigure"
    return NotebookFigure


_MADE_IN_CELL = []          # figures made while a notebook cell runs: shown when it ends, unless shown already
_HOOKED = set()             # the shells whose post_execute event shows them


def _notebook_shell():
    """The IPython kernel's shell when the code runs in a Jupyter notebook, else None."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    return shell if type(shell).__name__ == "ZMQInteractiveShell" else None


def _show_at_cell_end(fig):
    shell = _notebook_shell()
    if shell is None:
        return
    if id(shell) not in _HOOKED:
        shell.events.register("post_execute", _show_made_in_cell)
        _HOOKED.add(id(shell))
    _MADE_IN_CELL.append(fig)


def _show_made_in_cell():
    figures = list(_MADE_IN_CELL)
    _MADE_IN_CELL.clear()
    for fig in figures:
        if not getattr(fig, "_tinymlp_shown", False):
            fig._ipython_display_()


def _save(fig, path):
    """Write ``fig`` to ``path`` (its folder created; the format from the suffix, ".png" added without one),
    atomically: a failed save leaves no partial image and no temporary file."""
    if path is not None:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            with contextlib.suppress(OSError):      # else atomic_write names what is in the way
                os.makedirs(folder, exist_ok=True)
        path = os.fspath(path)
        suffix = os.path.splitext(path)[1][1:].lower()
        if not suffix and not os.path.isdir(path):    # as matplotlib does: "curves" -> "curves.png"
            suffix, path = "png", path + ".png"
        atomic_write(path, lambda f: fig.savefig(f, format=suffix, dpi=fig.dpi), what="plot")
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
def training_curves(history, path=None, title=None, val_name="validation"):
    """Loss (left) and accuracy (right) per epoch, training and validation; a Figure.

    ``history`` is a ``tinymlp.train.History`` or its ``to_dict()`` form (e.g. read back from
    ``metrics.json``). Validation curves are drawn when there are validation values, labelled
    ``val_name`` (the CIFAR scripts say "test": their held-out split is CIFAR's test set).
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
            ax.plot(*zip(*val), "o-", ms=3, label=val_name)
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


# ---------------------------------------------------------------------- confusion matrix
def confusion_matrix(labels, predicted, classes, path=None, title=None, max_classes=40):
    """Counts of (true class, predicted class), rows and columns named by ``classes``; a Figure.

    Each row is normalised by its class's count for the colour, and each cell shows the count;
    the row names give the class's accuracy (the diagonal over the row). With more than
    ``max_classes`` classes the names are left out and only the matrix is drawn.
    """
    labels, predicted = np.asarray(labels, dtype=np.int64), np.asarray(predicted, dtype=np.int64)
    k = len(classes)
    counts = np.zeros((k, k), dtype=np.int64)
    np.add.at(counts, (labels, predicted), 1)
    rows = counts.sum(axis=1, keepdims=True)
    share = counts / np.maximum(rows, 1)
    side = min(2.5 + 0.45 * k, 16)
    fig = _figure(side + 1.5, side)
    ax = fig.subplots()
    image = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=ax, shrink=0.8).set_label("share of the true class", fontsize=8)
    if k <= max_classes:
        names = [str(c) for c in classes]
        accuracy = [f"{name} ({100 * counts[i, i] / rows[i, 0]:.0f}%)" if rows[i, 0] else f"{name} (none)"
                    for i, name in enumerate(names)]
        ax.set_xticks(range(k), names, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(k), accuracy, fontsize=8)
        if k <= 20:
            for i in range(k):
                for j in range(k):
                    ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=7,
                            color="white" if share[i, j] > 0.5 else "black")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class (accuracy)")
    total = counts.sum()
    ax.set_title((f"{title}\n" if title else "") + f"accuracy {100 * np.trace(counts) / max(total, 1):.1f}% "
                 f"of {total:,}", fontsize=9)
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
    fig = _figure(max(4.5, 0.55 * cols + 1.5), max(3.5, 0.55 * rows + 1.6))
    ax = fig.subplots()
    im = _show(ax, _mosaic(tiles, cols), vmax=1.0)
    ax.set_title(f"token-mixing weights, block {block}:\n{units} hidden units on the {gh}x{gw} patch grid",
                 fontsize=9)
    bar = fig.colorbar(im, ax=ax, shrink=0.8, ticks=[-1, 0, 1])
    bar.set_label("weight / unit's max |weight|", fontsize=8)
    fig.supxlabel(TOKEN_MIXING_CAPTION, fontsize=7, wrap=True)
    return _save(fig, path)


TOKEN_MIXING_CAPTION = ("Each tile is one hidden unit; each pixel, one patch's weight. Red: the unit adds that "
                        "patch (positive weight); blue: it subtracts it (negative); white: it ignores it; "
                        "grey: gaps between tiles.")


# ---------------------------------------------------------------------- gMLP spatial weights
def _spatial_matrices(model_or_weight):
    """[(label, (S, S) array)] from a GMLP/AMLP, a block, an SGU, or weight(s) given directly."""
    from .grad_mode import no_grad

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


# ---------------------------------------------------------------------- the autograd graph
def _short(a, limit=4) -> str:
    """A few numbers of an array, or its norm when it is larger."""
    a = _numpy(a)
    if a.size <= limit:
        return np.array2string(a, precision=3, separator=", ", suppress_small=True).replace("\n", "")
    return f"|.| = {np.linalg.norm(a):.3g}"


def _shape(shape) -> str:
    return "(" + ", ".join(str(int(n)) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _function_name(fn) -> str:
    """The Function's name; a fast-tier stand-in shows the reference it implements ("GELU (fast)")."""
    if str(getattr(fn, "__module__", "")).startswith("tinymlp.fast"):
        for base in getattr(fn, "__mro__", ())[1:]:
            if not str(base.__module__).startswith("tinymlp.fast") and base.__name__ != "Function":
                return f"{base.__name__} (fast)"
    return getattr(fn, "__name__", type(fn).__name__)


def _graph_of(tensor):
    """The graph behind ``tensor`` as (nodes, edges): nodes are dicts with ``id``, ``kind``
    ("op", "leaf" or "output") and ``lines`` (the label), edges are (from id, to id) pairs,
    inputs to consumers. Op nodes are the Contexts the forward pass recorded; their output
    shape is read from the tensor itself (the root) or from a consumer's ``input_shapes``."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"graph: expected a Tensor, got {type(tensor).__name__}")
    ctx = tensor.grad_fn
    if ctx is not None and getattr(ctx, "fn", True) is None:
        raise ValueError("graph: the graph behind this tensor was freed by backward(); call "
                         "backward(retain_graph=True) to draw it after backward, or draw it before")

    def describe_leaf(t, kind):
        name = getattr(t, "name", None)
        head = ("leaf " + name) if (kind == "leaf" and name) else ("leaf" if kind == "leaf" else (name or "output"))
        lines = [head, f"{_shape(t.shape)} {t.dtype}"]
        if t.grad is not None:
            lines.append("grad " + _short(t.grad))
        elif kind == "output" and t.data.size <= 4:
            lines.append("value " + _short(t.data))
        return lines

    nodes, edges, out_shapes = {}, [], {}
    order = graph_nodes(tensor)                    # every node once (a diamond is drawn as one)
    for node in order:
        for i, parent in enumerate(graph_parents(node)):
            if parent is None:
                continue
            out_shapes.setdefault(id(parent), node.input_shapes[i])
            edges.append((id(parent), id(node)))
    for node in order:
        if isinstance(node, Tensor):
            nodes[id(node)] = {"id": id(node), "kind": "leaf" if node is not tensor or node.requires_grad else "output",
                               "lines": describe_leaf(node, "leaf")}
        else:
            shape = tensor.shape if node is tensor.grad_fn else out_shapes.get(id(node))
            name = _function_name(node.fn)
            nodes[id(node)] = {"id": id(node), "kind": "op",
                               "lines": [name, _shape(shape) if shape is not None else "?"]}
    if tensor.grad_fn is not None:                    # the tensor itself, as an oval after its op
        out_id = ("output", id(tensor))
        nodes[out_id] = {"id": out_id, "kind": "output", "lines": describe_leaf(tensor, "output")}
        edges.append((id(tensor.grad_fn), out_id))
    return list(nodes.values()), list(dict.fromkeys(edges))


def _layers(nodes, edges):
    """Column of each node: its longest distance from the output (the output on the right)."""
    consumers = {}
    for a, b in edges:
        consumers.setdefault(a, []).append(b)
    depth = {}
    ids = [n["id"] for n in nodes]
    for _ in range(len(ids) + 1):                  # longest path by relaxation (the graph is a DAG)
        changed = False
        for i in ids:
            d = max((depth.get(c, 0) + 1 for c in consumers.get(i, ())), default=0)
            if depth.get(i) != d:
                depth[i], changed = d, True
        if not changed:
            break
    return depth


def to_dot(tensor) -> str:
    """The autograd graph behind ``tensor`` as Graphviz DOT text (render it with ``dot -Tpng``).

    Ops are boxes (the Function's name and its output shape), tensors are ovals: leaves
    (marked ``leaf``, with their ``.grad`` once backward has run) and the tensor itself.
    Arrows point from inputs to the op that consumes them, the direction of the forward pass.
    """
    nodes, edges = _graph_of(tensor)
    key = {n["id"]: f"n{i}" for i, n in enumerate(nodes)}
    out = ["digraph autograd {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10];']
    for n in nodes:
        label = "\\n".join(line.replace('"', '\\"') for line in n["lines"])
        if n["kind"] == "op":
            style = 'shape=box, style="rounded,filled", fillcolor="#dde8f5"'
        elif n["kind"] == "leaf":
            style = 'shape=ellipse, style=filled, fillcolor="#f6e3c6", peripheries=2'
        else:
            style = 'shape=ellipse, style=filled, fillcolor="#d9efd9"'
        out.append(f'  {key[n["id"]]} [label="{label}", {style}];')
    for a, b in edges:
        out.append(f"  {key[a]} -> {key[b]};")
    out.append("}")
    return "\n".join(out) + "\n"


def graph(tensor, path=None):
    """Draw the autograd graph behind ``tensor`` with matplotlib alone; a Figure.

    Boxes are the recorded ops (``Function`` name and output shape), ovals the tensors:
    leaves (double outline, marked ``leaf``, with their gradient once ``backward`` has run:
    call ``backward(retain_graph=True)`` to keep the graph for drawing) and, on the right,
    the tensor itself. Inputs are on the left; arrows follow the forward pass, and backward
    walks them right to left. ``to_dot`` gives the same graph as Graphviz text.
    """
    from matplotlib.patches import Ellipse, FancyBboxPatch

    nodes, edges = _graph_of(tensor)
    depth = _layers(nodes, edges)
    columns = max(depth.values()) + 1
    by_column = {}
    for n in nodes:
        by_column.setdefault(depth[n["id"]], []).append(n)
    rows = max(len(v) for v in by_column.values())
    fig = _figure(max(4.0, 2.3 * columns), max(2.0, 1.1 * rows + 0.6))
    ax = fig.add_subplot()
    pos = {}
    for col, members in by_column.items():
        for r, n in enumerate(members):
            pos[n["id"]] = ((columns - 1 - col) * 2.3, (r - (len(members) - 1) / 2) * 1.1)
    width, height = 1.8, 0.8
    for a, b in edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax.annotate("", xy=(xb - width / 2, yb), xytext=(xa + width / 2, ya),
                    arrowprops=dict(arrowstyle="->", color="0.4", lw=1))
    colours = {"op": "#dde8f5", "leaf": "#f6e3c6", "output": "#d9efd9"}
    for n in nodes:
        x, y = pos[n["id"]]
        if n["kind"] == "op":
            patch = FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                   boxstyle="round,pad=0.02,rounding_size=0.08", fc=colours["op"], ec="0.3")
        else:
            patch = Ellipse((x, y), width, height, fc=colours[n["kind"]], ec="0.3",
                            lw=2.0 if n["kind"] == "leaf" else 1.0)
        ax.add_patch(patch)
        lines = n["lines"]
        ax.text(x, y, "\n".join(lines), ha="center", va="center",
                fontsize=8 if len(lines) < 3 else 7, fontweight="normal")
    ax.set_xlim(-width, (columns - 1) * 2.3 + width)
    ax.set_ylim(-(rows / 2) * 1.1 - 0.2, (rows / 2) * 1.1 + 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    return _save(fig, path)
