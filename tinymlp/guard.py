"""The in-place guard: ``backward()`` refuses to use a saved input that was changed after forward.

A gradient computed from values that changed after forward saved them is wrong, silently.
The guard follows every write into a saved input, by two routes:

- writes tinymlp makes (in-place operators, ``t[i] = v``, optimizer steps, ``load_state_dict``):
  each calls ``mark_written(t)``, which bumps the ``version`` of the tensor's memory (its
  ``Storage``, shared with the views and detached copies of the tensor); forward records the
  version of every input whose memory it saved, backward compares;
- writes through the raw array (``t.data[...] = v``, ``t.data -= lr * g``): the array is reached
  through ``t.data``, and that first read after a save takes a checksum (CRC-32) of the saved
  memory (``before_raw_access``), before the caller can write; backward takes it again and
  compares.

Integer and boolean arrays an op is given as they are (an index, class ids, a mask) are kept
by it for backward too: their checksum is taken at forward and compared at backward (CPU
arrays; they are small). Nothing is copied and nothing is read in a step that does neither
(the cost is a few small objects per saved input). Not seen: a write through an array taken from ``.data`` *before* the
forward pass that saved it.

The checksum route is CPU-only: on the GPU the versions are checked (writes through tinymlp are
refused on both devices), but no checksum is taken (it would read device memory back and stall
every step), so a write through ``t.data`` of a CUDA tensor is not seen there.

The interface: ``Function.apply`` calls ``share_views`` and ``record``; ``backward()`` calls
``check_unmodified`` before a node's backward (before its last one it then releases the
node's records, ``release``: the guard never keeps alive what backward frees); ``Tensor`` calls
``mark_written``, ``storage_of`` and ``before_raw_access``; ``nn`` and ``optim`` call
``mark_written`` when they write into parameters.
"""

from __future__ import annotations

import weakref
import zlib

import numpy as np

from .backend import array_module
from .contract import input_name
from .tensor import Tensor

__all__ = ["Constant", "Storage", "before_raw_access", "check_unmodified", "mark_written", "record", "release",
           "share_views", "storage_of"]


class Storage:
    """What the guard knows of one tensor's memory (shared by its views).

    ``version`` counts the writes made through tinymlp; ``saves`` lists a ``Saved`` for each
    graph node that saved this memory and has not run its (last) backward yet."""

    __slots__ = ("version", "saves")

    def __init__(self):
        self.version = 0
        self.saves = []


class Saved:
    """One input whose memory forward saved: enough for backward to tell whether it changed."""

    __slots__ = ("index", "array", "storage", "version", "name", "checksum", "node")

    def __init__(self, index, array, storage, name, node):
        self.index, self.array, self.storage, self.name = index, array, storage, name
        self.version = storage.version
        self.checksum = None
        self.node = weakref.ref(node)

    def pending(self):
        """Whether the node that saved the array may still run backward."""
        node = self.node()
        return node is not None and node.fn is not None


def storage_of(t: Tensor) -> Storage:
    """The guard's record of ``t``'s memory, made on first use."""
    if t.storage is None:
        t.storage = Storage()
    return t.storage


def mark_written(t: Tensor) -> None:
    """Record a write into ``t``'s memory made through tinymlp (an in-place operator, an
    optimizer step): a backward that needs the old values will refuse to run."""
    if t.storage is not None:
        t.storage.version += 1


def before_raw_access(storage: Storage) -> None:
    """Called by ``Tensor.data`` when a graph saved that memory: checksum it before the caller
    can write through the raw array (once per saving node), and forget finished nodes.
    CPU arrays only: a CuPy array is not checksummed (it would stall the GPU), so a write
    through ``.data`` of a CUDA tensor is not caught."""
    pending = [s for s in storage.saves if s.pending()]
    sums = {}
    for s in pending:
        if s.checksum is None and type(s.array).__module__ == "numpy":
            key = id(s.array)
            if key not in sums:
                sums[key] = _checksum(s.array)
            s.checksum = sums[key]
    storage.saves = pending


def _owner(arr):
    """The array that owns ``arr``'s memory (NumPy and CuPy point a view's ``base`` at it)."""
    base = getattr(arr, "base", None)
    return arr if base is None else base


def _shares(a, b):
    """Whether arrays ``a`` and ``b`` may overlap: only views of one owner can, and for those
    the array module's ``may_share_memory`` decides (a bounds test on the host, no device read)."""
    if a is b:
        return True
    if type(a) is not type(b) or _owner(a) is not _owner(b):
        return False
    may_share = getattr(array_module(a), "may_share_memory", None)
    return may_share(a, b) if may_share is not None else True


def _checksum(arr) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(arr)).cast("B"))


def share_views(result, out, args, arrays) -> None:
    """An output that is a view of an input (a reshape, a slice) shares its input's storage:
    a write into one is a write into the other (``out``: the result's array)."""
    owner = getattr(out, "base", None)         # NumPy and CuPy point a view's base at the owner
    if owner is None:                          # owns its memory: a new array
        return
    for a, arr in zip(args, arrays):
        if isinstance(a, Tensor) and (arr is owner or getattr(arr, "base", None) is owner) and _shares(out, arr):
            result.storage = storage_of(a)
            return


class Constant:
    """An integer or boolean array given to an op as it is (an index, class ids, a mask): backward
    may use it again, so its checksum is taken at forward (CPU arrays; they are small)."""

    __slots__ = ("index", "array", "checksum")

    def __init__(self, index, array):
        self.index, self.array, self.checksum = index, array, _checksum(array)


def _constants(values):
    """The NumPy integer and boolean arrays among ``values`` and inside their tuples and lists."""
    for v in values:
        if isinstance(v, (tuple, list)):
            yield from _constants(v)
        elif type(v) is np.ndarray and v.dtype.kind in "biu" and v.size:
            yield v


def record(ctx, args, arrays, kwargs=None) -> list:
    """For each input Tensor whose memory forward saved: a ``Saved`` record, also listed on the
    tensor's storage (so that ``.data`` can checksum it before a raw write); for each integer or
    boolean array passed as it is (an index, class ids): a ``Constant``. The node keeps the list
    for ``check_unmodified``."""
    records = []
    saved = ctx.saved_tensors
    ids = {id(s) for s in saved}                # the saved arrays,
    owners = {id(_owner(s)) for s in saved}     # and the arrays that own their memory
    for i, a in enumerate(args):
        if isinstance(a, Tensor):
            arr = arrays[i]
            if id(arr) in ids or (id(_owner(arr)) in owners and _overlaps(arr, saved)):
                records.append(_save(ctx, i, a, arr))
        elif isinstance(a, (np.ndarray, tuple, list)):
            records += [Constant(i, arr) for arr in _constants([a])]
    if kwargs:
        records += [Constant(None, arr) for arr in _constants(kwargs.values())]
    return records


def _overlaps(arr, saved):
    """Whether a saved array overlaps ``arr``, a view of the same owner (views of one owner may
    not: the two halves of the gating unit's z)."""
    return arr.size > 0 and any(_shares(s, arr) for s in saved)


def _save(ctx, index, t, arr):
    """The ``Saved`` record of input ``index`` (tensor ``t``, array ``arr``), listed on t's storage."""
    storage = t.storage if t.storage is not None else storage_of(t)
    if len(storage.saves) > 8:                     # graphs dropped without backward
        storage.saves = [s for s in storage.saves if s.pending()]
    saved_input = Saved(index, arr, storage, t.name, ctx)
    storage.saves.append(saved_input)
    return saved_input


def check_unmodified(node, last=False) -> None:
    """Raise if an input saved by ``node``'s forward was changed in place since (see above).
    Before the node's last backward (``last``) its records are then released: nothing checks
    them again, and the guard holds none of the arrays, so what that backward drops is freed at
    once (a Linear its input, before it allocates the input's gradient)."""
    for s in getattr(node, "guarded", ()):
        if isinstance(s, Constant):
            if _checksum(s.array) != s.checksum:
                reference = getattr(node.fn, "reference", node.fn)
                what = input_name(reference, s.index) if s.index is not None else "an index or mask argument"
                raise RuntimeError(
                    f"{reference.__name__}: {what}, an array of shape {tuple(s.array.shape)} given as it is, "
                    "was changed in place after forward, and backward reads it again, so the gradients "
                    "would be wrong; change a copy (index.copy()), or run backward() first")
            continue
        if s.storage.version != s.version:
            how = "by an in-place operation (x -= ..., x[i] = ..., or an optimizer step before backward())"
        elif s.checksum is not None and _checksum(s.array) != s.checksum:
            how = "through its array (x.data[...] = ..., x.data -= ...)"
        else:
            continue
        reference = getattr(node.fn, "reference", node.fn)
        what = input_name(reference, s.index) + (f" (tensor '{s.name}')" if s.name else "")
        raise RuntimeError(
            f"{reference.__name__}: {what}, of shape {tuple(s.array.shape)}, was modified in place {how} "
            "after forward saved it for backward, so its gradients would be wrong; change a copy, "
            "or run backward() first"
        )
    if last:
        release(node)


def release(node) -> None:
    """The node's last backward is next: its records leave the storages' lists and the node."""
    for s in getattr(node, "guarded", ()):
        if isinstance(s, Saved) and s in s.storage.saves:
            s.storage.saves.remove(s)
    node.guarded = ()
