"""The official JAX checkpoints (google-research/vision_transformer ``.npz``) as tinymlp models.

    model = from_jax_npz("Mixer-B_16.npz", num_classes=10)      # official .npz, new zero head

The Flax checkpoints store Dense kernels as (in, out), as tinymlp does, the stem as a conv
kernel (P, P, C_in, C) ("HWIO"), and a ViT's query/key/value kernels as (D, heads, d). The
models use the tanh GELU (Flax's default) and LayerNorm eps 1e-6, as the JAX code, so a
converted model computes what its source computes.
"""
from __future__ import annotations

import numpy as np

from ..models import MLPMixer, ViT
from .tables import (
    SAME, build, count_blocks, family_of_arch, grid_image_size, load_table, need_shape, pair, strip_prefix,
)
from .weight_files import InteropError, load_source

__all__ = ["from_jax_npz", "from_jax_state"]


def _jax_mixer_table(depth, head=True):
    rows = [("patch_embed.proj.weight", "stem/kernel", "hwio"), ("patch_embed.proj.bias", "stem/bias", SAME)]
    for i in range(depth):
        b, j = f"blocks.{i}.", f"MixerBlock_{i}/"
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_1")):
            rows += [(f"{b}{ours}.weight", f"{j}{theirs}/scale", SAME), (f"{b}{ours}.bias", f"{j}{theirs}/bias", SAME)]
        for ours, theirs in (("token_mlp", "token_mixing"), ("channel_mlp", "channel_mixing")):
            for k in (0, 1):
                rows += [(f"{b}{ours}.fc{k + 1}.weight", f"{j}{theirs}/Dense_{k}/kernel", SAME),
                         (f"{b}{ours}.fc{k + 1}.bias", f"{j}{theirs}/Dense_{k}/bias", SAME)]
    rows += [("norm.weight", "pre_head_layer_norm/scale", SAME), ("norm.bias", "pre_head_layer_norm/bias", SAME)]
    if head:
        rows += [("head.weight", "head/kernel", SAME), ("head.bias", "head/bias", SAME)]
    return rows


def _jax_vit_table(depth, head=True):
    rows = [("cls_token", "cls", SAME), ("pos_embed", "Transformer/posembed_input/pos_embedding", SAME),
            ("patch_embed.proj.weight", "embedding/kernel", "hwio"), ("patch_embed.proj.bias", "embedding/bias", SAME)]
    for i in range(depth):
        b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        a = f"{j}MultiHeadDotProductAttention_1/"
        for ours, theirs in (("norm1", "LayerNorm_0"), ("norm2", "LayerNorm_2")):
            rows += [(f"{b}{ours}.weight", f"{j}{theirs}/scale", SAME), (f"{b}{ours}.bias", f"{j}{theirs}/bias", SAME)]
        rows += [(f"{b}attn.qkv.weight", tuple(f"{a}{n}/kernel" for n in ("query", "key", "value")), "qkv"),
                 (f"{b}attn.qkv.bias", tuple(f"{a}{n}/bias" for n in ("query", "key", "value")), "qkv"),
                 (f"{b}attn.out.weight", f"{a}out/kernel", "heads_in"), (f"{b}attn.out.bias", f"{a}out/bias", SAME)]
        for k in (0, 1):
            rows += [(f"{b}mlp.fc{k + 1}.weight", f"{j}MlpBlock_3/Dense_{k}/kernel", SAME),
                     (f"{b}mlp.fc{k + 1}.bias", f"{j}MlpBlock_3/Dense_{k}/bias", SAME)]
    rows += [("norm.weight", "Transformer/encoder_norm/scale", SAME),
             ("norm.bias", "Transformer/encoder_norm/bias", SAME)]
    if head:
        rows += [("head.weight", "head/kernel", SAME), ("head.bias", "head/bias", SAME)]
    return rows


def _from_flax(arrays, layout):
    if layout == "hwio":       # conv kernel (P, P, C_in, C) -> (C_in P P, C) in (c, p1, p2) order
        ph, pw, cin, c = arrays.shape
        return arrays.transpose(2, 0, 1, 3).reshape(cin * ph * pw, c)
    if layout == "qkv":        # query/key/value kernels (D, h, d) or biases (h, d) -> [q | k | v] x heads
        return np.concatenate([a.reshape(*a.shape[:-2], -1) for a in arrays], axis=-1)
    if layout == "heads_in":   # out kernel (h, d, D) -> (h d, D)
        return arrays.reshape(-1, arrays.shape[-1])
    return arrays


def from_jax_npz(path, arch=None, *, num_classes=None, gelu="tanh", image_size=None, **config):
    """A tinymlp model from an official google-research/vision_transformer ``.npz`` checkpoint.

    Mixer (``stem/kernel``, ``MixerBlock_i/token_mixing/Dense_0/kernel``, ...) and ViT
    (``embedding/kernel``, ``Transformer/encoderblock_i/...``) checkpoints, as published for the
    papers (ImageNet-21k pre-trained, and fine-tuned ones). Dense kernels are (in, out), as
    tinymlp's; the stem is an HWIO conv kernel; a ViT's query/key/value kernels are (D, heads,
    d), so its heads are read from them. The models use the tanh GELU (Flax's default) and
    LayerNorm eps 1e-6, as the JAX code.

    ``num_classes``: a zero-initialised head for that many classes when the checkpoint's has
    another count. A ViT's ``pre_logits`` layer (the 21k "representation" checkpoints) goes
    with its head, as the official fine-tuning code drops it: such a checkpoint needs
    ``num_classes``.
    """
    arrays, _, what = load_source(path)
    return from_jax_state(arrays, what, arch, num_classes, gelu, image_size, config)


def from_jax_state(arrays, what, arch, num_classes, gelu, image_size, config):
    """``from_jax_npz`` on arrays already read: ``what`` names them in the errors, ``config``
    holds the other constructor keywords."""
    state = strip_prefix(arrays, ("opt/target/", "params/"))
    if arch is None:
        arch = "mixer" if "stem/kernel" in state else "vit" if "embedding/kernel" in state else None
    family = family_of_arch(arch) if arch is not None else None
    if family not in ("mixer", "vit"):
        raise InteropError(f"{what}: not an official Mixer (stem/kernel) or ViT (embedding/kernel) checkpoint")
    stem = need_shape(state, "stem/kernel" if family == "mixer" else "embedding/kernel", 4,
                      "a conv kernel (P, P, C_in, C)", what)
    ph, pw, cin, dim = stem.shape
    patch = ph if ph == pw else (ph, pw)
    has_head = "head/kernel" in state
    source_classes = need_shape(state, "head/kernel", 2, "(dim, classes)", what).shape[-1] if has_head else None
    has_pre_logits = "pre_logits/kernel" in state
    if has_pre_logits and (num_classes is None or num_classes == source_classes):
        raise InteropError(f"{what} has a pre_logits layer (a tanh 'representation' before its head), which "
                           "tinymlp's ViT does not have; pass num_classes=K to drop it with the head, as the "
                           "official fine-tuning does")
    if num_classes is None and source_classes is None:
        raise InteropError(f"{what} has no head: pass num_classes=K")
    keep_head = has_head and (num_classes is None or num_classes == source_classes)
    if family == "mixer":
        depth = count_blocks(state, "MixerBlock_{}/token_mixing/Dense_0/kernel", what)
        token_w = need_shape(state, "MixerBlock_0/token_mixing/Dense_0/kernel", 2, "(S, D_S)", what)
        cls, kwargs = MLPMixer, dict(
            image_size=grid_image_size(token_w.shape[0], pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, token_mlp_dim=token_w.shape[1],
            channel_mlp_dim=need_shape(
                state, "MixerBlock_0/channel_mixing/Dense_0/kernel", 2, "(C, D_C)", what).shape[1],
            eps=1e-6)
        table = _jax_mixer_table(depth, keep_head)
    else:
        depth = count_blocks(state, "Transformer/encoderblock_{}/LayerNorm_0/scale", what)
        pos = need_shape(state, "Transformer/posembed_input/pos_embedding", 3, "(1, tokens, dim)", what)
        heads = need_shape(state, "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel", 3,
                           "(dim, heads, head dim)", what).shape[1]
        cls, kwargs = ViT, dict(
            image_size=grid_image_size(pos.shape[1] - 1, pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, heads=heads,
            mlp_dim=need_shape(state, "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel", 2, "(dim, hidden)",
                               what).shape[1], eps=1e-6)
        table = _jax_vit_table(depth, keep_head)
    kwargs.update(num_classes=source_classes if num_classes is None else int(num_classes), gelu=gelu, **config)
    model = build(cls, kwargs, what)
    ignored = {"head/kernel", "head/bias", "pre_logits/kernel", "pre_logits/bias"} if not keep_head else set()
    load_table(model, state, table, ignored, what, f"official {family} checkpoint", convert=_from_flax)
    return model
