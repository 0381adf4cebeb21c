"""The training loop: ``fit`` and ``evaluate``, with tqdm progress bars and a ``History``.

Progress bars are on when stderr is a terminal or the code runs in a Jupyter notebook
(widgets there, as ``tqdm.auto`` draws them), off in logs and pipes; ``progress=True/False``
decides for itself.

    history = fit(model, optimizer, train_loader, val_loader, epochs=10,
                  scheduler=sched, clip=1.0, callbacks=[save_checkpoint])
    test_loss, test_acc = evaluate(model, test_loader)
    history.to_dict()           # JSON-able: metrics.json, or a checkpoint's metadata
    history.to_csv()            # one line per epoch: metrics.csv, for a spreadsheet or pandas
    print(summary(model))       # the input, the parameters of each block, the total

One training step is the usual few lines: forward, loss, ``zero_grad``, ``backward``,
optional gradient clipping, ``optimizer.step()``, ``scheduler.step()``.

No waiting for the GPU. On CUDA every array operation is queued and the host runs ahead;
asking for a number (``loss.item()``, ``float(x)``) makes the host wait until the queue has
drained. Reading the loss after every batch would therefore serialise host and device. The
loop instead *accumulates* its metrics on the device (a running sum of ``loss * batch`` and
a running count of correct predictions, in place in one small device array) and brings them
to the host only every ``sync_every`` batches and at the end of an epoch, in one transfer
(``_to_host``). The progress bar's loss and accuracy are running epoch means, refreshed then.

One CUDA graph per run. On CUDA (fast tier on) ``fit`` captures its step (forward, loss,
backward, clipping, the optimizer, the metrics' sums) into a CUDA graph after two warm-up steps
and replays it for every batch of the same shapes: one launch instead of some 500 ops issued by
Python (``tinymlp/fast/capture.py``). A batch of another shape (the last, partial one) runs the
eager step; so do evaluation and any step that cannot be captured (the reason is kept).
``graph=False`` turns it off. The history records, per epoch, how many steps were replayed.

Accuracy with soft targets (mixup, cutmix: a distribution over classes per image) counts a
prediction as correct when it is the target's most probable class.
"""

from __future__ import annotations

import csv
import io
import math
import sys
import time
import warnings
from dataclasses import dataclass, field, fields

import numpy as np
from tqdm import tqdm

from . import functional as F
from .grad_mode import no_grad
from .backend import array_module, parse_device, to_device
from .data.loader import as_count, as_fraction
from .fast.capture import CapturedStep
from .nn import ModuleList
from .optim import clip_grad_norm
from .tensor import Tensor

__all__ = ["History", "evaluate", "fit", "format_epoch", "summary"]

SYNC_EVERY = 20
"""Default number of batches between two reads of the running metrics (host syncs)."""


# ---------------------------------------------------------------------- history
@dataclass
class History:
    """Per-epoch metrics, one list entry per epoch (``val_*`` are None without validation).

    ``epoch`` holds epoch numbers counted from 1; ``lr`` the learning rate of the epoch's last
    step; ``epoch_time`` the seconds of the epoch (training and validation); ``images_per_sec``
    the training throughput (training images / training seconds); ``steps`` the optimizer steps
    taken since the start of the run, at the end of each epoch; ``warmup_time`` the seconds of
    the run's first training step, in the run's first epoch (None in the others); ``graph`` how
    the epoch's steps ran on CUDA: "N of M replayed from a CUDA graph", with the reasons of the
    eager ones (None on the CPU).

    The first step of a process is where CuPy compiles its kernels (and NumPy/BLAS warm up):
    on a GPU it can take longer than the rest of a short epoch. The first epoch's
    ``images_per_sec`` therefore leaves that step out (when the epoch has more than one), and
    ``warmup_time`` reports it apart.
    """

    epoch: list = field(default_factory=list)
    train_loss: list = field(default_factory=list)
    train_acc: list = field(default_factory=list)
    val_loss: list = field(default_factory=list)
    val_acc: list = field(default_factory=list)
    lr: list = field(default_factory=list)
    epoch_time: list = field(default_factory=list)
    images_per_sec: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    warmup_time: list = field(default_factory=list)
    graph: list = field(default_factory=list)

    OPTIONAL = ("warmup_time", "graph")
    """Fields that ``append`` and ``from_dict`` fill with None when left out (a saved history
    without them)."""

    def __len__(self) -> int:
        return len(self.epoch)

    def append(self, **row) -> None:
        """Add one epoch; every field must be given (None is allowed for ``val_*``; ``warmup_time``
        may be left out: None)."""
        names = [f.name for f in fields(self)]
        row = {**{name: None for name in self.OPTIONAL}, **row}
        if set(row) != set(names):
            raise ValueError(f"History.append needs exactly the fields {names}, got {sorted(row)}")
        for name in names:
            getattr(self, name).append(row[name])

    def last(self) -> dict:
        """The latest epoch as a dict ``{field: value}``."""
        if not self.epoch:
            raise IndexError("History.last(): no epoch recorded yet")
        return {f.name: getattr(self, f.name)[-1] for f in fields(self)}

    def to_dict(self) -> dict:
        """``{field: list}`` of plain Python numbers (and None), ready for ``json.dump``."""
        return {f.name: [_plain(v) for v in getattr(self, f.name)] for f in fields(self)}

    def to_csv(self) -> str:
        """A header line naming the fields, then one line per epoch (an empty cell for None)."""
        columns = self.to_dict()
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(columns)
        for row in zip(*columns.values()):
            writer.writerow(["" if v is None else repr(float(v)) if isinstance(v, float) else int(v) for v in row])
        return text.getvalue()

    @classmethod
    def from_dict(cls, data) -> History:
        """The inverse of ``to_dict``: a dict of lists of one length, holding numbers (or None). Anything
        else (a damaged record) is a ValueError saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"History.from_dict: expected a dict of lists, got {type(data).__name__}")
        names = [f.name for f in fields(cls)]
        epochs = data.get("epoch", ())
        data = {**{n: [None] * len(epochs) for n in cls.OPTIONAL if isinstance(epochs, list)}, **data}
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"History.from_dict: missing fields {missing}")
        for n in names:
            if not isinstance(data[n], (list, tuple)):
                raise ValueError(f"History.from_dict: {n} is a {type(data[n]).__name__}, expected a list")
        lengths = {n: len(data[n]) for n in names}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"History.from_dict: fields of different lengths {lengths}")
        return cls(**{n: [_number(v, n) for v in data[n]] for n in names})


def _number(value, name):
    """``_plain(value)``, which must be a number or None: a ValueError naming the field otherwise."""
    value = _plain(value) if isinstance(value, (np.generic, np.ndarray)) and np.ndim(value) == 0 else value
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"History.from_dict: {name} holds {value!r}, expected numbers (or None)")
    return value


def _plain(value):
    """A NumPy scalar or 0-d array as a Python int/float; None and Python numbers unchanged."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return np.asarray(value).item()


def format_epoch(history: History, total_epochs=None, val_name="val", unit="img") -> str:
    """One line describing the last epoch of ``history`` (for logs and ``--no-progress`` runs).

    ``val_name`` is the word for the held-out split ("test" when it is the dataset's test set);
    ``unit`` the word for one training example in the throughput ("img/s"; "samples/s" for text).
    """
    r = history.last()
    of = f"/{total_epochs}" if total_epochs else ""
    text = f"epoch {r['epoch']}{of}: train loss {r['train_loss']:.4f} acc {100 * r['train_acc']:.2f}%"
    if r["val_loss"] is not None:
        text += f" | {val_name} loss {r['val_loss']:.4f} acc {100 * r['val_acc']:.2f}%"
    text += f" | lr {r['lr']:.2e} | {r['images_per_sec']:.0f} {unit}/s"
    if r.get("warmup_time") is not None:
        text += f" (first step {r['warmup_time']:.1f} s, counted apart)"
    if r.get("graph") is not None:
        text += f" | {r['graph']}"
    return text + f" | {r['epoch_time']:.1f} s"


# ---------------------------------------------------------------------- what a run trains
def summary(model) -> str:
    """What a run prints when training starts: the model's input, one row per part with its
    parameters (each block of a stack on a row of its own: ``blocks.0``, ``blocks.1``, ...), and
    the total. A parameter shared by two parts (tied weights) is counted once, in the first."""
    rows = []                              # (name, what it is)
    for name, child in model.named_children():
        if isinstance(child, ModuleList):
            rows += [(f"{name}.{index}", type(block).__name__) for index, block in child.named_children()]
        else:
            rows.append((name, type(child).__name__))
    counts = {name: 0 for name, _ in rows}
    own = []                               # the model's own parameters (a class token, a position table)
    for name, p in model.named_parameters():
        owner = next((row for row in counts if name.startswith(row + ".")), None)
        if owner is None:
            own.append((name, "Parameter"))
            counts[owner := name] = 0
        counts[owner] += p.size
    rows[1:1] = own                        # after the embedding, where a ViT's forward uses them
    width = max([len(name) for name, _ in rows] + [5])
    kind = max([len(what) for _, what in rows] + [1])
    lines = [f"{type(model).__name__}: {_input_of(model)}"]
    lines += [f"  {name:{width}s}  {what:{kind}s}  {counts[name]:>12,}" for name, what in rows]
    lines.append(f"  {'total':{width}s}  {'':{kind}s}  {model.num_parameters():>12,} parameters")
    return "\n".join(lines)


def _input_of(model) -> str:
    """The input a model takes, read from its ``config``: images and their patches, or token ids."""
    config = getattr(model, "config", None) or {}
    if "image_size" in config and "patch_size" in config:
        size, patch = config["image_size"], config["patch_size"]
        h, w = (size, size) if isinstance(size, int) else size
        ph, pw = (patch, patch) if isinstance(patch, int) else patch
        return (f"input images ({config.get('in_channels', 3)}, {h}, {w}) -> {(h // ph) * (w // pw)} tokens "
                f"(patches of {ph} x {pw}) of {config.get('dim', '?')} channels")
    if "seq_len" in config:
        return (f"input {config['seq_len']} token ids (a vocabulary of {config.get('vocab_size', '?'):,}) -> "
                f"{config['seq_len']} tokens of {config.get('dim', '?')} channels")
    return "input size not recorded in its config"


# ---------------------------------------------------------------------- metrics on the device
class _Running:
    """Sums of ``loss * batch_size`` and of correct predictions, in place in one float64 array on
    the batches' device (a captured step adds into its memory at each replay).

    ``add`` queues a few tiny device operations and returns at once (``accumulate``: the device
    half, which a CUDA graph replays; ``count`` is the host's); ``read`` is the only place that
    waits for the device (see the module docstring).
    """

    def __init__(self):
        self.sums = None              # device array (float64): [sum of loss * batch, correct]
        self.count = 0                # images seen: a host int, known from the shapes

    def reset(self):
        if self.sums is not None:
            self.sums[...] = 0
        self.count = 0

    def add(self, loss, logits, target):
        self.accumulate(loss, logits, target)
        self.count += len(target)

    def accumulate(self, loss, logits, target):
        xp = array_module(logits)
        if target.ndim == 2:          # soft targets: the most probable class counts as the label
            target = target.argmax(axis=1)
        if self.sums is None:
            self.sums = xp.zeros(2, dtype=np.float64)
        loss_sum, correct = self.sums[:1], self.sums[1:]
        xp.add(loss_sum, loss.astype(np.float64) * len(target), out=loss_sum)
        xp.add(correct, xp.count_nonzero(logits.argmax(axis=1) == target), out=correct)

    def read(self):
        """(mean loss, accuracy) as Python floats: one device-to-host transfer."""
        if not self.count:
            return math.nan, math.nan
        loss_sum, correct = _to_host(self.sums[0], self.sums[1])
        return loss_sum / self.count, correct / self.count


def _to_host(*scalars):
    """Bring device scalars to the host in one transfer (the loop's only synchronisation)."""
    xp = array_module(scalars[0])
    stacked = xp.stack([xp.asarray(s, dtype=np.float64) for s in scalars])
    return [float(v) for v in to_device(stacked, "cpu")]


# ---------------------------------------------------------------------- progress bars
def _progress_enabled(progress) -> bool:
    """``None`` means: bars when someone watches: stderr is a terminal, or the code runs in a
    Jupyter notebook (tqdm.auto draws widgets there); not in logs, CI or pipes."""
    if progress is None:
        return bool(getattr(sys.stderr, "isatty", lambda: False)()) or _in_notebook()
    return bool(progress)


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell), without importing IPython."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if get is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _bar(show, **kwargs):
    return _tqdm_class()(disable=not show, dynamic_ncols=True, **kwargs)


def _tqdm_class():
    """tqdm.auto's choice: widgets in a Jupyter notebook that has ipywidgets, text elsewhere
    (and in a notebook without ipywidgets, where tqdm.auto would warn and fall back to text)."""
    if _in_notebook():
        try:
            from tqdm.notebook import IProgress, tqdm as notebook_tqdm
        except ImportError:
            return tqdm
        if IProgress is not None:
            return notebook_tqdm
    return tqdm


def _num_batches(loader, limit_batches):
    try:
        n = len(loader)
    except TypeError:
        n = None
    if limit_batches is not None:
        n = limit_batches if n is None else min(n, int(limit_batches))
    return n


def _batches(loader, limit_batches, device):
    """Yield (x, y) from ``loader`` as Tensors on ``device`` (no copy when already there)."""
    for i, (x, y) in enumerate(loader, start=1):
        yield _on(x, device), _on(y, device)
        if limit_batches is not None and i >= limit_batches:
            return


def _on(x, device):
    return x.to(device) if isinstance(x, Tensor) else Tensor(x, device=device)


def _model_device(model) -> str:
    for p in model.parameters():
        return p.device
    return "cpu"


# ---------------------------------------------------------------------- evaluate
def evaluate(model, loader, limit_batches=None, loss_fn=F.cross_entropy, device=None, progress=False):
    """Mean loss and accuracy of ``model`` over ``loader`` (at most ``limit_batches`` batches).

    Runs in evaluation mode (dropout off) without building a graph, and puts the model back in
    the mode it was in. The mean is over images (batches weighted by their size). Returns
    ``(loss, accuracy)`` as Python floats, accuracy in [0, 1]; one host sync at the end. A loader
    that gives no batches is a ValueError (there is no mean of nothing).
    """
    device = parse_device(device) if device is not None else _model_device(model)
    limit_batches = None if limit_batches is None else as_count(limit_batches, "evaluate: limit_batches")
    _check_not_empty(loader, "evaluate", "loader")
    was_training = model.training
    model.eval()
    running = _Running()
    try:
        with no_grad(), _bar(_progress_enabled(progress), desc="eval", leave=False,
                             total=_num_batches(loader, limit_batches)) as bar:
            for x, y in _batches(loader, limit_batches, device):
                logits = model(x)
                running.add(loss_fn(logits, y).data, logits.data, y.data)
                bar.update(1)
    finally:
        model.train(was_training)
    if not running.count:
        raise ValueError(f"evaluate: the loader gave no batches ({_describe(loader)}), so there is no loss to report")
    return running.read()


def _describe(loader) -> str:
    """What a loader holds, for the message that it gave no batches."""
    try:
        n, size = len(loader.dataset), loader.batch_size
    except (AttributeError, TypeError):
        return type(loader).__name__
    drop = " and drop_last=True" if getattr(loader, "drop_last", False) else ""
    return f"{n} examples, batch_size {size}{drop}"


def _check_not_empty(loader, who, name):
    """A loader whose len() is 0 gives no batches: refused before any work, naming it."""
    try:
        n = len(loader)
    except TypeError:
        return                      # no len(): checked once it has been iterated
    if n == 0:
        raise ValueError(f"{who}: {name} gives no batches ({_describe(loader)}); give it more examples or a "
                         "smaller batch_size"
                         + (" (or drop_last=False)" if getattr(loader, "drop_last", False) else ""))

# ---------------------------------------------------------------------- fit
def fit(model, optimizer, train_loader, val_loader=None, epochs=1, scheduler=None, clip=None,
        device=None, callbacks=(), progress=None, limit_batches=None, loss_fn=F.cross_entropy,
        start_epoch=0, history=None, sync_every=SYNC_EVERY, val_name="val", unit="img", graph=True) -> History:
    """Train ``model`` until ``epochs`` epochs are done in total; return the ``History``.

    - ``epochs`` counts from the start of the run: with ``start_epoch=k`` (k epochs already done,
      e.g. after loading a checkpoint) the loop runs epochs k+1 .. ``epochs`` and appends them
      to ``history`` (a new History when None).
    - ``scheduler.step()`` is called after every optimizer step; ``clip`` (a max norm) clips
      the gradients with ``optim.clip_grad_norm`` before the step.
    - ``device``: where the batches go (None: the device of the model's parameters). Put the
      model there before building the optimizer.
    - ``callbacks``: callables ``cb(epoch, history)`` run after each epoch, ``epoch`` being the
      number of epochs done (1, 2, ...): checkpointing, logging, plots.
    - ``progress``: True, False, or None for "when stderr is a terminal or in a Jupyter
      notebook". Two tqdm bars (widgets in a notebook, as ``tqdm.auto``): the epochs, and the
      batches of the current epoch with the running loss, accuracy and lr.
      Without bars nothing is printed (log with a callback, e.g. ``format_epoch``).
    - ``limit_batches``: at most this many batches per epoch, for training and validation
      (smoke runs).
    - ``sync_every``: batches between two reads of the running metrics (see the module docstring).
    - ``val_name``: the word the progress output uses for ``val_loader``'s split ("test" when
      it is the dataset's test set); ``unit``: its word for one training example ("img" gives
      "img/s"; "samples" for text).
    - ``graph``: on CUDA, capture the step into a CUDA graph and replay it for every batch of
      the captured shapes (see the module docstring); False runs every step eagerly.

    Counts (``epochs``, ``limit_batches``, ``sync_every``) are whole numbers: a float or a
    boolean is a TypeError. A loader that gives no batches is a ValueError (before training when
    its ``len()`` is 0), never a history of NaN or a callback run on nothing.

    A loss that becomes NaN or infinite stops training with a FloatingPointError that says
    when (it is noticed at the next read of the metrics). A validation loss that is NaN or
    infinite does not stop training (the model may still be learning): it is reported with a
    RuntimeWarning and recorded in the history as it is.
    """
    device = parse_device(device) if device is not None else _model_device(model)
    if _model_device(model) != device:
        raise ValueError(
            f"fit: the model's parameters are on {_model_device(model)!r} but device={device!r}; "
            f"call model.to({device!r}) before building the optimizer"
        )
    epochs = as_count(epochs, "fit: epochs", minimum=0)
    start_epoch = as_count(start_epoch, "fit: start_epoch", minimum=0)
    limit_batches = None if limit_batches is None else as_count(limit_batches, "fit: limit_batches")
    sync_every = as_count(sync_every, "fit: sync_every")
    if clip is not None:        # 0: no clipping
        clip = as_fraction(clip, "fit: clip (the largest gradient norm)", 0.0, math.inf, high_ok=False) or None
    _check_not_empty(train_loader, "fit", "train_loader")
    if val_loader is not None:
        _check_not_empty(val_loader, "fit", "val_loader")
    history = History() if history is None else history
    show = _progress_enabled(progress)
    steps = history.steps[-1] if history.steps else 0
    per_epoch = _num_batches(train_loader, limit_batches)
    running = _Running()
    step = _training_step(model, optimizer, loss_fn, clip, running, graph and device == "cuda")

    with _bar(show, desc="epochs", total=epochs, initial=start_epoch, unit="epoch") as epoch_bar:
        for epoch in range(start_epoch, epochs):
            model.train()
            running.reset()
            counts = dict(step.counts) if isinstance(step, CapturedStep) else {}
            lr = optimizer.lr
            started = time.perf_counter()
            warmup = warmup_images = None
            with _bar(show, desc=f"epoch {epoch + 1}/{epochs}", total=per_epoch, leave=False,
                      unit="batch") as bar:
                for i, (x, y) in enumerate(_batches(train_loader, limit_batches, device), start=1):
                    lr = optimizer.lr
                    step(x, y)                            # forward, loss, backward, clip, update, sums
                    if scheduler is not None:
                        scheduler.step()
                    steps += 1
                    running.count += len(y)
                    if i == 1 and epoch == start_epoch:   # compilation and warm-up: timed apart
                        warmup, warmup_images = time.perf_counter() - started, running.count
                    if i % sync_every == 0:
                        _show_running(bar, running, lr, epoch + 1, i)
                    bar.update(1)
                if not running.count:
                    raise ValueError(f"fit: train_loader gave no batches in epoch {epoch + 1} "
                                     f"({_describe(train_loader)}): nothing was trained, no callback was run")
                train_loss, train_acc = _check_finite(running.read(), epoch + 1, running.count)
            train_time = time.perf_counter() - started  # the read above waited for the device
            timed_images = running.count
            if warmup is not None and running.count > warmup_images and train_time > warmup:
                train_time -= warmup
                timed_images -= warmup_images

            val_loss = val_acc = None
            if val_loader is not None:
                val_loss, val_acc = evaluate(model, val_loader, limit_batches, loss_fn, device)
                if not math.isfinite(val_loss):
                    warnings.warn(
                        f"epoch {epoch + 1}: the {val_name} loss is {val_loss} while the training loss is "
                        f"{train_loss:.4g}: the model gives non-finite outputs on some {val_name} images "
                        "(look for NaN or inf in that data, or values far outside the training range)",
                        RuntimeWarning, stacklevel=2,
                    )
            history.append(
                epoch=epoch + 1, train_loss=train_loss, train_acc=train_acc, val_loss=val_loss,
                val_acc=val_acc, lr=lr, epoch_time=time.perf_counter() - started,
                images_per_sec=timed_images / train_time if train_time > 0 else math.nan, steps=steps,
                warmup_time=warmup, graph=_graph_summary(step, counts, device),
            )
            if show:
                epoch_bar.write(format_epoch(history, epochs, val_name, unit))
                epoch_bar.set_postfix(_postfix(history.last(), val_name), refresh=False)
                epoch_bar.update(1)
            for callback in callbacks:
                callback(epoch + 1, history)
    return history


def _training_step(model, optimizer, loss_fn, clip, running, graph):
    """fit's step on a batch ``(x, y)``: forward, loss, backward, clipping, the optimizer and the
    metrics' device sums; captured into a CUDA graph and replayed where ``graph`` (on CUDA) and
    the step allows (``CapturedStep``: the parameters are what it writes, the optimizer's flat
    buffers what else it reads)."""
    def step(x, y):
        logits = model(x)
        loss = loss_fn(logits, y)
        optimizer.zero_grad()
        loss.backward()
        if clip:
            clip_grad_norm(model.parameters(), clip, sync=False)
        optimizer.step()
        running.accumulate(loss.data, logits.data, y.data)

    if not graph:
        return step
    return CapturedStep(step, model.parameters(), lambda: tuple(optimizer.flat_state or ()))


def _graph_summary(step, before, device):
    """How this epoch's steps ran: "N of M steps replayed from a CUDA graph (eager: reasons)"."""
    if device != "cuda":
        return None
    if not isinstance(step, CapturedStep):
        return "every step eager (graph=False)"
    counts = {k: n - before.get(k, 0) for k, n in step.counts.items() if n > before.get(k, 0)}
    replayed = counts.pop("replayed", 0)
    eager = ", ".join(f"{n} {why}" for why, n in counts.items())
    return (f"{replayed} of {replayed + sum(counts.values())} steps replayed from a CUDA graph"
            + (f" (eager: {eager})" if eager else ""))


def _show_running(bar, running, lr, epoch, batch):
    loss, acc = _check_finite(running.read(), epoch, running.count, batch)
    bar.set_postfix(loss=f"{loss:.4f}", acc=f"{100 * acc:.1f}%", lr=f"{lr:.2e}")  # drawn now


def _check_finite(metrics, epoch, images, batch=None):
    loss, acc = metrics
    if images and not math.isfinite(loss):
        where = f"epoch {epoch}" + (f", by batch {batch}" if batch else "")
        raise FloatingPointError(
            f"the training loss became {loss} ({where}): lower the learning rate, use gradient "
            "clipping (clip=1.0), or check the inputs for NaN"
        )
    return loss, acc


def _postfix(row, val_name="val"):
    out = {"loss": f"{row['train_loss']:.4f}", "acc": f"{100 * row['train_acc']:.1f}%"}
    if row["val_acc"] is not None:
        out[f"{val_name}_acc"] = f"{100 * row['val_acc']:.1f}%"
    return out
