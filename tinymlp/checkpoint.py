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

The state of every random Generator the model's modules keep (Dropout's masks) is saved too,
and ``load`` puts it back into the model's own generators: a resumed run draws the masks the
uninterrupted run would have drawn.

Metadata may hold numbers, strings, None, lists, tuples, dicts with string keys, dataclasses,
arrays and ``numpy.random.Generator`` objects (stored as their bit generator's state and given
back as a new Generator in that state). Anything else is refused: nothing is ever pickled,
so a checkpoint from someone else cannot run code when loaded.

Saving is atomic: the file is written under a temporary name in the same folder, flushed to
disk, then renamed over the old checkpoint in one step (``os.replace``). A crash mid-save
leaves the previous checkpoint intact, and the next save to that path deletes the temporary
file the crash left behind.

Loading checks before it trusts: a file that is empty, truncated, damaged (an array whose
header declares more bytes than the file holds), a plain ``.npy``, or not a checkpoint at all
raises one ``CheckpointError`` naming the file and what is wrong;
an optimizer state is only loaded into an optimizer of the type that saved it. Every value is
checked before anything changes (``load`` is all or nothing): the model's arrays as
``Module.load_state_dict`` checks them (shape; floating point, finite and within range for a
float parameter), the optimizer's and the schedule's state as their constructors check their
arguments. A name read from the file (a bit generator's, a class's) is only ever looked up in
a fixed list, never imported or called as given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import zipfile
import zlib

import numpy as np

from . import files
from .backend import to_device
from .nn.module import StateDictError

__all__ = ["CheckpointError", "CheckpointMismatchError", "generator_state", "load", "module_generators",
           "read_meta", "restore_generator", "save"]

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


BIT_GENERATORS = {cls.__name__: cls for cls in (np.random.PCG64, np.random.PCG64DXSM, np.random.MT19937,
                                                np.random.Philox, np.random.SFC64)}


def restore_generator(state: dict, rng: np.random.Generator | None = None) -> np.random.Generator:
    """Set ``rng`` to ``state`` (from ``generator_state``), or build a new Generator in that state.

    The bit generator is looked up among NumPy's own (PCG64, PCG64DXSM, MT19937, Philox,
    SFC64): a name read from a file never selects anything else. A state that does not fit
    raises a ValueError.
    """
    state = _unjson_arrays(state)
    kind = state.get("bit_generator") if isinstance(state, dict) else None
    if not isinstance(kind, str) or kind not in BIT_GENERATORS:
        raise ValueError(f"not the state of a NumPy bit generator (bit_generator {kind!r}; "
                         f"expected one of {', '.join(BIT_GENERATORS)})")
    bits = BIT_GENERATORS[kind]() if rng is None else type(rng.bit_generator)()
    try:
        bits.state = state                  # on a scratch bit generator first: rng is unchanged on error
    except (TypeError, ValueError, KeyError, OverflowError) as err:
        raise ValueError(f"a {kind} state that does not fit ({type(err).__name__}: {_first_line(err)})") from None
    if rng is None:
        return np.random.Generator(bits)
    rng.bit_generator.state = bits.state
    return rng


def module_generators(model) -> dict:
    """``{"<module>.<attribute>": Generator}`` for every random Generator a module of ``model``
    keeps (Dropout's ``rng``): the state a resumed run needs to draw the same masks."""
    found = {}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, np.random.Generator):
                found[f"{name}.{attr}" if name else attr] = value
    return found


def _check_generators(saved, model, path):
    """[(the model's Generator, the state to give it)] for the generators saved in a checkpoint."""
    if not isinstance(saved, dict):
        raise CheckpointError(f"{path}: its {HEADER} is damaged (the generators entry is not a dict)")
    own, out = module_generators(model), []
    for name, state in saved.items():
        if name not in own:
            continue
        try:
            scratch = restore_generator(state)
        except (ValueError, AttributeError, TypeError) as err:
            raise CheckpointError(f"{path}: the saved random state of {name} is damaged: {err}") from None
        if type(scratch.bit_generator) is not type(own[name].bit_generator):
            raise CheckpointError(f"{path}: {name} was saved as a {type(scratch.bit_generator).__name__} generator, "
                                  f"the model's is a {type(own[name].bit_generator).__name__}")
        out.append((own[name], scratch.bit_generator.state))
    return out


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
            try:
                return restore_generator(obj["__generator__"])
            except (ValueError, AttributeError, TypeError) as err:
                raise ValueError(f"a saved random generator is damaged: {err}") from None
        return {k: _decode(v, npz) for k, v in obj.items()}
    return obj


# ---------------------------------------------------------------------- saving
def save(path, model, optimizer=None, scheduler=None, **meta) -> None:
    """Write ``model`` (and ``optimizer``, ``scheduler``, keyword metadata) to ``path``, atomically."""
    arrays = {f"model/{name}": value for name, value in model.state_dict().items()}  # host copies
    header = {"format": FORMAT, "version": VERSION, "model": type(model).__name__,
              "meta": _encode(meta, "meta", arrays),
              "generators": {k: generator_state(g) for k, g in module_generators(model).items()}}
    if optimizer is not None:
        header["optim"] = _encode(optimizer.state_dict(), "optim", arrays)
        header["optim_class"] = type(optimizer).__name__
    if scheduler is not None:
        header["sched"] = _encode(scheduler.state_dict(), "sched", arrays)
    arrays[HEADER] = np.frombuffer(json.dumps(header).encode("utf-8"), dtype=np.uint8)
    _write_atomically(os.fspath(path), arrays)


def _write_atomically(path, arrays):
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"checkpoint.save: the folder {folder} does not exist "
                                f"(create it first, e.g. os.makedirs({folder!r}))", folder)
    # as every save: a killed save's leftover removed first; a folder, a read-only file or a symbolic
    # link at `path` refused or said; a full disk named
    files.atomic_write(path, lambda f: np.savez(f, allow_pickle=False, **arrays), what="checkpoint.save")


# ---------------------------------------------------------------------- loading
def _read_header(npz, path):
    if HEADER not in npz.files:
        raise CheckpointError(f"{path} is not a tinymlp checkpoint (no {HEADER} entry)")
    try:
        header = json.loads(npz[HEADER].tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: the checkpoint's {HEADER} entry is damaged (not valid UTF-8 JSON: "
                              f"{_first_line(err)})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise CheckpointError(f"{path}: its {HEADER} does not describe a tinymlp checkpoint "
                              f"(format {found!r}, expected {FORMAT!r})")
    if not isinstance(header.get("version"), int) or header["version"] > VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {header.get('version')!r}; this tinymlp "
                              f"reads versions up to {VERSION} (a newer tinymlp wrote it?)")
    if "meta" not in header:
        raise CheckpointError(f"{path}: its {HEADER} is damaged (no 'meta' entry)")
    return header


ZIP_MAGIC, NPY_MAGIC = b"PK\x03\x04", b"\x93NUMPY"
WHAT_IT_IS = "a tinymlp checkpoint is the .npz file written by tinymlp.checkpoint.save"


@contextlib.contextmanager
def _open(path):
    """``np.load(path)`` of a tinymlp checkpoint, every way it can fail turned into one
    CheckpointError naming the file and what is wrong with it (never NumPy's pickle advice)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(NPY_MAGIC))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path} is a folder, not a checkpoint file ({WHAT_IT_IS})") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not head:
        raise CheckpointError(f"{path} is empty (0 bytes: a copy or save that never finished); {WHAT_IT_IS}")
    if head.startswith(NPY_MAGIC):
        raise CheckpointError(f"{path} holds a single NumPy array (.npy, from np.save), not a checkpoint; "
                              f"{WHAT_IT_IS}")
    if not head.startswith(ZIP_MAGIC[:len(head)]) or len(head) < len(ZIP_MAGIC):
        raise CheckpointError(f"{path} is not a tinymlp checkpoint (it does not start like an .npz/zip "
                              f"file: first bytes {head[:4]!r}); {WHAT_IT_IS}")
    problem = files.npz_problem(path)         # the arrays' headers, before anything is allocated
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            yield npz
    except CheckpointError:
        raise
    except MemoryError:
        raise CheckpointError(f"{path}: an array in it is larger than the memory here (a damaged file, or "
                              "a checkpoint too large for this machine)") from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zlib.error) as err:
        raise CheckpointError(f"{path} is damaged or truncated (an incomplete copy or download?): "
                              f"{type(err).__name__}: {_first_line(err)}") from None


def _first_line(err):
    text = str(err).strip().splitlines()
    return text[0] if text else "no detail"


def read_meta(path) -> dict:
    """The metadata saved in a checkpoint, without loading anything into a model."""
    with _open(path) as npz:
        return _decode(_read_header(npz, path)["meta"], npz)


def load(path, model, optimizer=None, scheduler=None) -> dict:
    """Load a checkpoint written by ``save`` into ``model`` (and ``optimizer``, ``scheduler``).

    Returns the metadata. Everything is checked before anything is changed: a checkpoint of a
    different architecture raises a CheckpointError that lists the missing, unexpected and
    wrongly shaped keys, and leaves the model, optimizer and schedule as they were.
    """
    with _open(path) as npz:
        header = _read_header(npz, path)
        saved_optim = header.get("optim_class")
        if optimizer is not None and saved_optim is not None and saved_optim != type(optimizer).__name__:
            raise CheckpointError(
                f"{path}: the optimizer state was saved from {saved_optim}, not {type(optimizer).__name__}: "
                f"its moments and hyper-parameters (lr, weight decay, betas) belong to {saved_optim}; resume with a "
                f"{saved_optim} optimizer, or load the model alone (optimizer=None) to start a new optimizer"
            )
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

    def mismatch(missing, unexpected, mismatched, invalid):
        return CheckpointMismatchError(type(model).__name__, missing, unexpected, mismatched, source="checkpoint",
                                       where=f"{path} (saved from {header.get('model')}): ", invalid=invalid)

    prepared, _ = model.prepare_state(state, error=mismatch)
    if optimizer is not None:
        try:
            optimizer.check_state_dict(optim_state)
        except (TypeError, ValueError, KeyError) as err:
            raise CheckpointError(
                f"{path}: the optimizer state (saved from {header.get('optim_class')}) does not fit "
                f"this {type(optimizer).__name__}: {err}"
            ) from None
    if scheduler is not None:
        try:
            scheduler.check_state_dict(sched_state)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{path}: the schedule state does not fit this {type(scheduler).__name__}: "
                                  f"{err}") from None
    generators = _check_generators(header.get("generators", {}), model, path)
    # everything checked: from here on nothing can fail half-way
    model.assign_state(prepared)
    if optimizer is not None:
        optimizer.load_state_dict(optim_state)
    if scheduler is not None:
        scheduler.load_state_dict(sched_state)
    for rng, state in generators:
        rng.bit_generator.state = state
    return meta
