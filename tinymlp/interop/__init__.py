"""Pretrained weights in, models out: timm and the official JAX checkpoints, without pickle.

    model = from_timm("mixer_b16_224.safetensors")              # MLP-Mixer, gMLP or ViT, sizes inferred
    model = from_timm(timm_model.state_dict())                  # any mapping name -> array
    model = from_timm("vit.safetensors", heads=12)              # ViT: the heads are not in the weights
    model = from_jax_npz("Mixer-B_16.npz", num_classes=10)      # official vision_transformer .npz, new head
    save_timm(model, "mine.safetensors")                        # timm's names and layouts, for PyTorch
    weights = to_timm(model)                                    # the same as a dict of NumPy arrays

A state dict is only names and arrays, so a model moves between libraries by renaming and by
transposing where the two libraries store a layer differently. One concern a module:

- ``weight_files.py``: reading and writing ``.safetensors`` and ``.npz`` as NumPy arrays, never
  a pickle (``read_weights``, ``save_safetensors``, ``PickleRefusedError``);
- ``tables.py``: name tables (tinymlp name, source name, layout) and loading one into a model;
- ``timm_weights.py``: timm's names and layouts (``from_timm``, ``to_timm``, ``save_timm``,
  ``create_timm_model``);
- ``jax_weights.py``: the official Flax checkpoints (``from_jax_npz``);
- ``pretrained.py``: either source, told by the names (``load_pretrained``, ``weights_source``);
- ``surgery.py``: fine-tuning changes (``replace_head``, ``change_image_size``, ``resize_pos_embed``).

Exact numerics: timm's layers use the exact GELU and its gMLP gate normalises with eps 1e-5,
the official JAX models the tanh GELU; ``from_timm`` and ``from_jax_npz`` build models with the
source's own forms, so a converted model computes what its source computes (logits equal to
float32 round-off).
"""

from .jax_weights import from_jax_npz
from .pretrained import is_flax, load_pretrained, weights_source
from .surgery import change_image_size, replace_head, resize_pos_embed
from .timm_weights import create_timm_model, from_timm, save_timm, to_timm
from .weight_files import (
    InteropError, PickleRefusedError, conversion_command, load_safetensors, read_weights, save_safetensors,
)

__all__ = [
    "InteropError", "PickleRefusedError", "change_image_size", "conversion_command", "create_timm_model",
    "from_jax_npz", "from_timm", "is_flax", "load_pretrained", "load_safetensors", "read_weights",
    "replace_head", "resize_pos_embed", "save_safetensors", "save_timm", "to_timm", "weights_source",
]
