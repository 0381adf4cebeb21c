"""Model surgery for fine-tuning: a new head, another input resolution.

    model = replace_head(model, num_classes=10)           # zero-initialised, for the new classes
    model = change_image_size(model, 384)                 # ViT: position embedding resampled
"""

from __future__ import annotations

import numpy as np

from ..data.transforms import resize
from ..models import ViT
from ..nn import Linear, init
from .tables import pair
from .weight_files import InteropError, as_numpy

__all__ = ["change_image_size", "replace_head", "resize_pos_embed"]


def replace_head(model, num_classes: int):
    """Give ``model`` a new zero-initialised head for ``num_classes`` classes, in place (returns it).

    Zero weights and biases: every class starts at logit 0, the first loss is ln(K), and the
    pretrained features are not disturbed by a random projection in the first steps.
    """
    head = model.head
    dim = head.in_features
    new = Linear(dim, int(num_classes))
    init.zeros(new.weight)
    init.zeros(new.bias)
    device = head.weight.device if hasattr(head.weight, "device") else "cpu"
    model.head = new.to(device=device, dtype=head.weight.dtype)
    model.config = {**model.config, "num_classes": int(num_classes)}
    return model


def resize_pos_embed(pos_embed, old_grid, new_grid, num_prefix_tokens: int = 1) -> np.ndarray:
    """Bilinearly resample a ViT position table (1, prefix + gh * gw, D) to another patch grid.

    The class token's entry (the first ``num_prefix_tokens``) is kept; the grid entries are
    laid out as the (gh, gw) image they are (row-major patches) and resized to ``new_grid``.
    """
    pos = as_numpy(pos_embed)
    (gh, gw), (nh, nw) = pair(old_grid), pair(new_grid)
    prefix, grid = pos[:, :num_prefix_tokens], pos[:, num_prefix_tokens:]
    if grid.shape[1] != gh * gw:
        raise InteropError(f"resize_pos_embed: {grid.shape[1]} grid entries do not form a {gh}x{gw} grid")
    dim = grid.shape[-1]
    image = grid.reshape(1, gh, gw, dim).transpose(0, 3, 1, 2).astype(np.float64)    # (1, D, gh, gw)
    image = resize(image, (nh, nw))
    grid = image.transpose(0, 2, 3, 1).reshape(1, nh * nw, dim).astype(pos.dtype)
    return np.concatenate([prefix, grid], axis=1)


def change_image_size(model, image_size):
    """A copy of ``model`` for another input resolution; for ViT the position embedding is resampled.

    MLP-Mixer's token-mixing and gMLP's spatial weights have one row and column per token, so
    they are tied to the patch grid they were trained on: those models keep their resolution
    (asking for another raises an InteropError that says so).
    """
    size = pair(image_size)
    c = model.config
    if size == pair(c["image_size"]):
        return model
    if not isinstance(model, ViT):
        raise InteropError(
            f"{type(model).__name__} has weights over its {c['image_size']}-pixel patch grid (token mixing / "
            f"spatial gating sees each token position), so it fine-tunes at its pretraining resolution: use "
            f"image size {c['image_size']}, not {size[0] if size[0] == size[1] else size}")
    patch = pair(c["patch_size"])
    if size[0] % patch[0] or size[1] % patch[1]:
        raise InteropError(f"image size {size} is not a multiple of the patch size {patch}")
    new = type(model)(**{**c, "image_size": image_size})
    state = dict(model.state_dict())
    if "pos_embed" in state:
        old_grid = model.patch_embed.grid
        state["pos_embed"] = resize_pos_embed(state["pos_embed"], old_grid, new.patch_embed.grid)
    new.load_state_dict(state)
    device = model.head.weight.device if hasattr(model.head.weight, "device") else "cpu"
    return new.to(device=device)
