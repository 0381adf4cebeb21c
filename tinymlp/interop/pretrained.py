"""Either source: a weights file whose names say whether it is timm's or the official JAX one.

    model = load_pretrained("weights.safetensors", num_classes=10)   # timm or Flax names, either
    weights_source("Mixer-B_16.npz")                                  # "jax", "timm" or "tinymlp"
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .jax_weights import from_jax_state
from .timm_weights import from_timm_state
from .weight_files import InteropError, load_source, read_weights, safetensors_header, sniff_format

CHECKPOINT_HEADER = "__header__"        # the entry that makes an .npz a tinymlp training checkpoint

__all__ = ["is_flax", "load_pretrained", "weights_source"]


def load_pretrained(source, *, num_classes=None, heads=None, gelu=None, image_size=None, **config):
    """A tinymlp model from timm weights or an official JAX ``.npz``, whichever ``source`` holds.

    Flax names (``stem/kernel``, ``embedding/kernel``, ...) go to ``from_jax_npz``, timm names to
    ``from_timm``; the keywords are theirs (``gelu`` defaults to each source's own form).
    """
    state, meta, what = load_source(source)
    if is_flax(state):
        return from_jax_state(state, what, None, num_classes, gelu or "tanh", image_size, config)
    return from_timm_state(state, meta, what, None, num_classes, heads, gelu, image_size, config)


def weights_source(path) -> str:
    """"jax" (official Flax names), "tinymlp" (written by ``save_timm``), "timm", or "checkpoint"
    (a training checkpoint of tinymlp, ``tinymlp.checkpoint.save``), from the names and header of
    a weights file alone (the arrays are not read)."""
    path = Path(path)
    kind = sniff_format(path) if path.is_file() else "unknown"
    if kind == "npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                names = npz.files
        except Exception as err:       # a damaged zip: one sentence naming the file
            raise InteropError(f"{path} is damaged or truncated (an incomplete download?): "
                               f"{type(err).__name__}") from None
        if CHECKPOINT_HEADER in names:
            return "checkpoint"
        meta = {"tinymlp": "1"} if "__tinymlp_meta__" in names else {}
    elif kind == "safetensors":
        header = safetensors_header(path)            # checked against the file's size: truncated is named
        names = [k for k in header if k != "__metadata__"]
        meta = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    else:
        read_weights(path)          # raises the right error (missing, pickle, unknown format)
        names, meta = [], {}
    if "tinymlp" in meta:
        return "tinymlp"
    return "jax" if is_flax(names) else "timm"


def is_flax(state) -> bool:
    """Whether a mapping's names are Flax's (``a/b/kernel``) rather than PyTorch's (``a.b.weight``)."""
    return any("/" in k for k in state)
