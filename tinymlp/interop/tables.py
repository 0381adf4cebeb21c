"""Name tables: how a state dict in another library's names becomes a tinymlp model's.

A table is a list of rows ``(tinymlp name, source name, layout)``, one per array; the layout
says how the source stores it (``SAME``: as tinymlp does; the timm and Flax modules add theirs).
``load_table`` checks that a state dict holds exactly the table's source names, converts every
array to tinymlp's layout and loads them all, or nothing. The helpers read a model's sizes off
its weights: the block count, a square patch grid's image size.
"""

from __future__ import annotations

import math

import numpy as np

from ..nn.module import StateDictError, value_problem
from .weight_files import InteropError

__all__ = ["SAME", "build", "count_blocks", "family_of_arch", "grid_image_size", "load_table", "need", "need_shape",
           "pair", "strip_prefix"]

FAMILIES = ("mixer", "gmlp", "vit")

SAME = "same"        # the layout of an array stored as tinymlp stores it


def _names(theirs):
    return theirs if isinstance(theirs, tuple) else (theirs,)


def load_table(model, state, table, ignored, what, source_name, convert):
    """Check that ``state`` holds exactly the table's source names (less ``ignored``), convert each
    array to tinymlp's layout (``convert(array, layout)``; a row whose source names are a tuple
    gets the tuple of their arrays) and load them all into ``model`` (a missing head stays zero).
    ``what`` names the source in the errors, ``source_name`` the kind of model it should be."""
    expected = [name for _, theirs, _ in table for name in _names(theirs)]
    unexpected = sorted(set(state) - set(expected) - set(ignored))
    missing = [name for name in expected if name not in state]
    if unexpected or missing:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)}: {', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)}: {', '.join(unexpected[:5])}"
                         f"{', ...' if len(unexpected) > 5 else ''}")
        raise InteropError(
            f"{what} does not have the layout of a plain {source_name} that tinymlp's {type(model).__name__} "
            f"can hold ({'; '.join(parts)}). Variants with extra parts (layer scale, register tokens, "
            "fc_norm, q/k norms, a representation layer, ...) have no tinymlp counterpart."
        )
    dtypes = {k: t.dtype for k, t in model.state_tensors().items()}
    invalid = [(name, why) for ours, theirs, _ in table for name in _names(theirs)
               if (why := value_problem(state[name], dtypes.get(ours, np.float32))) is not None]
    if invalid:
        shown = "; ".join(f"{name} {why}" for name, why in invalid[:3])
        more = f" (and {len(invalid) - 3} more)" if len(invalid) > 3 else ""
        raise InteropError(f"{what}: {len(invalid)} weight{'s' * (len(invalid) != 1)} cannot be loaded into "
                           f"{type(model).__name__}: {shown}{more}; nothing was loaded")
    converted = {}
    for ours, theirs, layout in table:      # a tuple of names: one array built from several (Flax q, k, v)
        value = tuple(np.asarray(state[n]) for n in theirs) if isinstance(theirs, tuple) else np.asarray(state[theirs])
        converted[ours] = convert(value, layout)
    if not any(ours == "head.weight" for ours, _, _ in table):
        converted["head.weight"] = np.zeros_like(model.head.weight.data)    # zero head, as a new model has
        converted["head.bias"] = np.zeros_like(model.head.bias.data)
    try:
        model.load_state_dict(converted)
    except StateDictError as err:      # shapes that do not fit the sizes read off the other weights
        raise InteropError(f"{what}: the weights do not fit one {source_name} model ({err}); the file is "
                           "damaged or mixes two models") from None


def build(cls, kwargs, what):
    """``cls(**kwargs)``, a constructor's refusal of the sizes read off the weights as an InteropError."""
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise InteropError(f"{what}: the sizes read off its weights do not make a {cls.__name__} ({err})") from None


# ---------------------------------------------------------------------- sizes read off the weights
def need(state, key, what):
    """``state[key]``, or an InteropError that ``what`` lacks it."""
    if key not in state:
        raise InteropError(f"{what}: the weights have no {key!r}")
    return state[key]


def count_blocks(state, probe, what="the weights"):
    """How many blocks: the first i for which ``probe.format(i)`` is not a name in ``state``."""
    depth = 0
    while probe.format(depth) in state:
        depth += 1
    if depth == 0:
        raise InteropError(f"{what}: no blocks found (no {probe.format(0)!r}); the file is incomplete or not a "
                           "checkpoint of this architecture")
    return depth


def need_shape(state, key, ndim, layout, what):
    """``state[key]`` (see ``need``), which must have ``ndim`` dimensions, as ``layout`` says."""
    value = need(state, key, what)
    shape = tuple(np.shape(value))
    if len(shape) != ndim:
        raise InteropError(f"{what}: {key!r} has shape {shape}; expected {layout} ({ndim} dimensions)")
    return value


def grid_image_size(num_tokens, patch, image_size, what):
    """Image size from a token count (a square grid) unless given."""
    if image_size is not None:
        return image_size
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise InteropError(f"{what}: {num_tokens} tokens is not a square grid; pass image_size=(H, W)")
    return side * patch[0] if patch[0] == patch[1] else (side * patch[0], side * patch[1])


def pair(v):
    """(v, v) for an int, else the pair as a tuple."""
    return (v, v) if isinstance(v, int) else tuple(v)


def strip_prefix(state, prefixes):
    """``state`` without the first of ``prefixes`` that every name starts with ("module.", ...)."""
    for prefix in prefixes:
        if state and all(k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items()}
    return state


def family_of_arch(arch):
    """"mixer", "gmlp" or "vit" from an architecture name: the family itself or a timm model
    name that starts with it (mixer_b16_224, gmlp_s16_224, vit_base_patch16_224, ...)."""
    name = str(arch).lower()
    for family in FAMILIES:
        if name == family or name.startswith(family + "_"):
            return family
    raise InteropError(f"arch={arch!r}: expected 'mixer', 'gmlp', 'vit' or a timm model name starting "
                       "with one of them (mixer_b16_224, gmlp_s16_224, vit_base_patch16_224, ...)")
