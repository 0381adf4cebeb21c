"""Checkpoints: model, optimizer, schedule and metadata in one ``.npz`` file, without pickle.

    save("run/last.npz", model, opt, sched, epoch=3, step=1200, rng=rng, config=vars(args))
    meta = load("run/last.npz", model, opt, sched)        # meta["epoch"] == 3, meta["rng"]: a Generator

Inside the file (an ordinary NumPy ``.npz``, readable with ``np.load(path, allow_pickle=False)``):

- ``model/<dotted.name>``: each entry of ``model.state_dict()``;
- ``optim/...``, ``sched/...``, ``meta/...``: the arrays found inside the optimizer's state
  dict, the schedule's state dict and the metadata (e.g. ``optim/state/3/exp_avg``);
- ``__header__``: UTF-8 JSON bytes (a uint8 array) holding everything else: the format
  version, the metadata and the non-array parts of the state dicts, where each array stands
  as ``{"__array__": "<its key in the file>"}``.

Metadata may hold numbers, strings, None, lists, tuples, dicts with string keys, dataclasses,
arrays and ``numpy.random.Generator`` objects (stored as their bit generator's state and given
back as a new Generator in that state). Anything else is refused: nothing is ever pickled,
so a checkpoint from someone else cannot run code when loaded.

Saving is atomic: the file is written under a temporary name in the same folder, flushed to
disk, then renamed over the old checkpoint in one step (``os.replace``). A crash mid-save
leaves the previous checkpoint intact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile

import numpy as np

from .backend import to_device
from .nn.module import StateDictError

__all__ = ["CheckpointError", "CheckpointMismatchError", "generator_state", "load", "read_meta",
           "restore_generator", "save"]

FORMAT = "tinymlp-checkpoint"
VERSION = 1
HEADER = "__header__"


class CheckpointError(RuntimeError):
    """A file that is not a tinymlp checkpoint, or that does not fit what it is loaded into."""


class CheckpointMismatchError(CheckpointError, StateDictError):
    """A checkpoint of another architecture: the message and the ``missing``, ``unexpected``
    and ``mismatched`` keys of ``StateDictError`` (``Module.load_state_dict``'s own error)."""


# ---------------------------------------------------------------------- random generators
def generator_state(rng: np.random.Generator) -> dict:
    """The state of ``rng`` (its bit generator's) as a JSON-able dict."""
    return _json_arrays(rng.bit_generator.state)


def restore_generator(state: dict, rng: np.random.Generator | None = None) -> np.random.Generator:
    """Set ``rng`` to ``state`` (from ``generator_state``), or build a new Generator in that state."""
    state = _unjson_arrays(state)
    if rng is None:
        rng = np.random.Generator(getattr(np.random, state["bit_generator"])())
    rng.bit_generator.state = state
    return rng


def _json_arrays(obj):
    """Replace the arrays inside a bit generator state (MT19937's key, ...) by tagged lists."""
    if isinstance(obj, dict):
        return {k: _json_arrays(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _unjson_arrays(obj):
    if isinstance(obj, dict):
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
        return {k: _unjson_arrays(v) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------- encoding
def _encode(obj, key, arrays):
    """``obj`` as JSON-able data; its arrays go into ``arrays`` under keys built from ``key``."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.random.Generator):
        return {"__generator__": generator_state(obj)}
    if hasattr(obj, "__array__") and hasattr(obj, "shape"):  # a NumPy or CuPy array
        name = key
        while name in arrays:
            name += "_"
        arrays[name] = np.array(to_device(obj, "cpu"), copy=True)
        if arrays[name].dtype == object:
            raise TypeError(f"checkpoint: {key} is an object array, which cannot be saved without pickle")
        return {"__array__": name}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"checkpoint: {key} has a key of type {type(k).__name__}; use str keys")
            out[str(k)] = _encode(v, f"{key}/{k}", arrays)
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v, f"{key}/{i}", arrays) for i, v in enumerate(obj)]
    raise TypeError(
        f"checkpoint: cannot store {key} of type {type(obj).__name__} without pickle; "
        "convert it to numbers, strings, lists, dicts or arrays"
    )


def _decode(obj, npz):
    if isinstance(obj, list):
        return [_decode(v, npz) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1 and "__array__" in obj:
            return npz[obj["__array__"]]
        if len(obj) == 1 and "__generator__" in obj:
            return restore_generator(obj["__generator__"])
        return {k: _decode(v, npz) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------- saving
def save(path, model, optimizer=None, scheduler=None, **meta) -> None:
    """Write ``model`` (and ``optimizer``, ``scheduler``, keyword metadata) to ``path``, atomically."""
    arrays = {f"model/{name}": value for name, value in model.state_dict().items()}  # host copies
    header = {"format": FORMAT, "version": VERSION, "model": type(model).__name__,
              "meta": _encode(meta, "meta", arrays)}
    if optimizer is not None:
        header["optim"] = _encode(optimizer.state_dict(), "optim", arrays)
        header["optim_class"] = type(optimizer).__name__
    if scheduler is not None:
        header["sched"] = _encode(scheduler.state_dict(), "sched", arrays)
    arrays[HEADER] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    _write_atomically(os.fspath(path), arrays)


def _write_atomically(path, arrays):
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, allow_pickle=False, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)  # atomic: readers see the old file or the new one, never a mix
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable (POSIX)
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _file_mode(path):
    """The old checkpoint's permissions, or the usual ones for a new file (mkstemp uses 0600)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


# ---------------------------------------------------------------------- loading
def _read_header(npz, path):
    if HEADER not in npz.files:
        raise CheckpointError(f"{path} is not a tinymlp checkpoint (no {HEADER} entry)")
    header = json.loads(npz[HEADER].tobytes().decode("utf-8"))
    if header.get("format") != FORMAT or header.get("version", 0) > VERSION:
        raise CheckpointError(
            f"{path}: unsupported checkpoint format {header.get('format')!r} version {header.get('version')}"
        )
    return header


def read_meta(path) -> dict:
    """The metadata saved in a checkpoint, without loading anything into a model."""
    with np.load(path, allow_pickle=False) as npz:
        return _decode(_read_header(npz, path)["meta"], npz)


def load(path, model, optimizer=None, scheduler=None) -> dict:
    """Load a checkpoint written by ``save`` into ``model`` (and ``optimizer``, ``scheduler``).

    Returns the metadata. Everything is checked before anything is changed: a checkpoint of a
    different architecture raises a CheckpointError that lists the missing, unexpected and
    wrongly shaped keys, and leaves the model, optimizer and schedule as they were.
    """
    with np.load(path, allow_pickle=False) as npz:
        header = _read_header(npz, path)
        state = {k[len("model/"):]: npz[k] for k in npz.files if k.startswith("model/")}
        optim_state = sched_state = None
        if optimizer is not None:
            if "optim" not in header:
                raise CheckpointError(f"{path} holds no optimizer state (it was saved without an optimizer)")
            optim_state = _decode(header["optim"], npz)
        if scheduler is not None:
            if "sched" not in header:
                raise CheckpointError(f"{path} holds no schedule state (it was saved without a scheduler)")
            sched_state = _decode(header["sched"], npz)
        meta = _decode(header["meta"], npz)

    missing, unexpected, mismatched = model.state_mismatches(state)
    if missing or unexpected or mismatched:
        raise CheckpointMismatchError(type(model).__name__, missing, unexpected, mismatched,
                                      source="checkpoint", where=f"{path} (saved from {header.get('model')}): ")
    if optimizer is not None:
        try:
            optimizer._check_state_dict(optim_state)
        except (ValueError, KeyError) as err:
            raise CheckpointError(
                f"{path}: the optimizer state (saved from {header.get('optim_class')}) does not fit "
                f"this {type(optimizer).__name__}: {err}"
            ) from None
    if scheduler is not None and len(sched_state["base_lrs"]) != len(scheduler.optimizer.param_groups):
        raise CheckpointError(
            f"{path}: the schedule was saved for {len(sched_state['base_lrs'])} param group(s), "
            f"this one drives {len(scheduler.optimizer.param_groups)}"
        )
    model.load_state_dict(state)
    if optimizer is not None:
        optimizer.load_state_dict(optim_state)
    if scheduler is not None:
        scheduler.load_state_dict(sched_state)
    return meta
