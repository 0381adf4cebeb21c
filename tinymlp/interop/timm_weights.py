"""timm's names and layouts: timm weights in (``from_timm``), timm weights out (``to_timm``).

    model = from_timm("mixer_b16_224.safetensors")              # MLP-Mixer, gMLP or ViT, sizes inferred
    model = from_timm(timm_model.state_dict())                  # any mapping name -> array
    model = from_timm("vit.safetensors", heads=12)              # ViT: the heads are not in the weights
    save_timm(model, "mine.safetensors")                        # timm's names and layouts, for PyTorch
    weights = to_timm(model)                                    # the same as a dict of NumPy arrays
    net = create_timm_model(model)                              # the PyTorch model (needs torch, timm)

A state dict is only names and arrays, so a model moves between libraries by renaming and by
transposing where the two libraries store a layer differently:

    tinymlp                          timm                                how
    -------------------------------  ----------------------------------  -----------------------------
    any Linear weight (in, out)      nn.Linear weight (out, in)          transposed
    patch_embed.proj.weight          stem.proj.weight (Mixer, gMLP),     a conv with kernel = stride
      (C_in P P, C)                  patch_embed.proj.weight (ViT),      = P is a Linear on flattened
                                     (C, C_in, P, P)                     patches: w.reshape(C, -1).T
    Mixer token_mlp, channel_mlp     mlp_tokens, mlp_channels            fc1, fc2 transposed
    gMLP proj_in, proj_out           mlp_channels.fc1, mlp_channels.fc2  transposed
    gMLP sgu.weight (S, S)           mlp_channels.gate.proj.weight       NOT transposed: both are
                                                                         (out_token, in_token)
    gMLP sgu.norm                    mlp_channels.gate.norm              as is
    ViT attn.qkv, attn.out           attn.qkv, attn.proj                 transposed; [q | k | v] x
                                                                         heads in the same order
    norm, head, cls_token, ...       the same names                      (head transposed)

Exact numerics. timm's layers use the exact GELU x Phi(x) and its gMLP gate normalises with
eps 1e-5: ``from_timm`` builds models with ``gelu="exact"`` and ``sgu_eps=1e-5``, so a converted
model computes what its source computes (logits equal to float32 round-off).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..files import atomic_write
from ..models import AMLP, GMLP, MLPMixer, ViT
from .tables import (
    SAME, build, count_blocks, family_of_arch, grid_image_size, load_table, need_shape, pair, strip_prefix,
)
from .weight_files import InteropError, as_numpy, load_source, save_safetensors

__all__ = ["TIMM_TABLES", "create_timm_model", "from_timm", "from_timm_state", "save_timm", "to_timm"]

VIT_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16}


# ---------------------------------------------------------------------- name and layout tables
LINEAR = "linear"    # torch Linear (out, in) <-> tinymlp (in, out)
CONV = "conv"        # torch conv (C, C_in, P, P) <-> tinymlp (C_in P P, C)


def _timm_mixer_table(depth, head=True):
    rows = [("patch_embed.proj.weight", "stem.proj.weight", CONV), ("patch_embed.proj.bias", "stem.proj.bias", SAME)]
    for i in range(depth):
        b = f"blocks.{i}."
        for norm in ("norm1", "norm2"):
            rows += [(f"{b}{norm}.{p}", f"{b}{norm}.{p}", SAME) for p in ("weight", "bias")]
        for ours, theirs in (("token_mlp", "mlp_tokens"), ("channel_mlp", "mlp_channels")):
            for fc in ("fc1", "fc2"):
                rows += [(f"{b}{ours}.{fc}.weight", f"{b}{theirs}.{fc}.weight", LINEAR),
                         (f"{b}{ours}.{fc}.bias", f"{b}{theirs}.{fc}.bias", SAME)]
    return rows + _timm_tail(head)


def _timm_gmlp_table(depth, head=True):
    rows = [("patch_embed.proj.weight", "stem.proj.weight", CONV), ("patch_embed.proj.bias", "stem.proj.bias", SAME)]
    for i in range(depth):
        b, m = f"blocks.{i}.", f"blocks.{i}.mlp_channels."
        rows += [(f"{b}norm.weight", f"{b}norm.weight", SAME), (f"{b}norm.bias", f"{b}norm.bias", SAME),
                 (f"{b}proj_in.weight", f"{m}fc1.weight", LINEAR), (f"{b}proj_in.bias", f"{m}fc1.bias", SAME),
                 (f"{b}sgu.norm.weight", f"{m}gate.norm.weight", SAME),
                 (f"{b}sgu.norm.bias", f"{m}gate.norm.bias", SAME),
                 (f"{b}sgu.weight", f"{m}gate.proj.weight", SAME),       # both (out_token, in_token)
                 (f"{b}sgu.bias", f"{m}gate.proj.bias", SAME),
                 (f"{b}proj_out.weight", f"{m}fc2.weight", LINEAR), (f"{b}proj_out.bias", f"{m}fc2.bias", SAME)]
    return rows + _timm_tail(head)


def _timm_vit_table(depth, head=True):
    rows = [("cls_token", "cls_token", SAME), ("pos_embed", "pos_embed", SAME),
            ("patch_embed.proj.weight", "patch_embed.proj.weight", CONV),
            ("patch_embed.proj.bias", "patch_embed.proj.bias", SAME)]
    for i in range(depth):
        b = f"blocks.{i}."
        for norm in ("norm1", "norm2"):
            rows += [(f"{b}{norm}.{p}", f"{b}{norm}.{p}", SAME) for p in ("weight", "bias")]
        for ours, theirs in (("attn.qkv", "attn.qkv"), ("attn.out", "attn.proj"), ("mlp.fc1", "mlp.fc1"),
                             ("mlp.fc2", "mlp.fc2")):
            rows += [(f"{b}{ours}.weight", f"{b}{theirs}.weight", LINEAR),
                     (f"{b}{ours}.bias", f"{b}{theirs}.bias", SAME)]
    return rows + _timm_tail(head)


def _timm_tail(head):
    rows = [("norm.weight", "norm.weight", SAME), ("norm.bias", "norm.bias", SAME)]
    if head:
        rows += [("head.weight", "head.weight", LINEAR), ("head.bias", "head.bias", SAME)]
    return rows


TIMM_TABLES = {"mixer": _timm_mixer_table, "gmlp": _timm_gmlp_table, "vit": _timm_vit_table}


def _to_tinymlp_layout(array, layout):
    if layout == LINEAR:
        return array.T
    if layout == CONV:
        return array.reshape(array.shape[0], -1).T      # (C, C_in, P, P) -> (C_in P P, C), (c, p1, p2) order
    return array


def _to_timm_layout(array, layout, patch_shape=None):
    if layout == LINEAR:
        return array.T
    if layout == CONV:
        return array.T.reshape(array.shape[1], *patch_shape)   # (C_in P P, C) -> (C, C_in, P, P)
    return array


# ---------------------------------------------------------------------- timm -> tinymlp
def _family_of_timm(state, arch):
    if arch is not None:
        return family_of_arch(arch)
    if "blocks.0.mlp_channels.gate.proj.weight" in state:
        return "gmlp"
    if "blocks.0.mlp_tokens.fc1.weight" in state:
        return "mixer"
    if "cls_token" in state and "blocks.0.attn.qkv.weight" in state:
        return "vit"
    hint = ", ".join(sorted(state)[:6])
    raise InteropError(
        "cannot tell the architecture from the weights: expected timm's MlpMixer (blocks.0.mlp_tokens...), "
        f"gMLP (blocks.0.mlp_channels.gate...) or VisionTransformer (cls_token, blocks.0.attn.qkv...) names; "
        f"found {hint}{', ...' if len(state) > 6 else ''}. Pass arch= if the names are timm's."
    )


def _patch(state, key, what):
    """(C_in, patch size: int or pair, C) of the (C, C_in, P_h, P_w) conv weight ``state[key]``."""
    c, cin, ph, pw = need_shape(state, key, 4, "a conv kernel (C, C_in, P, P)", what).shape
    return cin, (ph if ph == pw else (ph, pw)), c


def _vit_heads(arch, heads, what):
    if heads is not None:
        return int(heads)
    match = re.match(r"vit_([a-z]+)_", str(arch or "").lower())
    if match and match.group(1) in VIT_HEADS:
        return VIT_HEADS[match.group(1)]
    raise InteropError(
        f"{what}: a ViT's number of attention heads is not stored in its weights; pass heads=N "
        f"(examples/finetune.py: --heads N) "
        f"(timm's sizes: {', '.join(f'{k} {v}' for k, v in VIT_HEADS.items())}), or arch='vit_base_patch16_224' "
        "and the like"
    )


def _timm_config(family, state, arch, heads, what, image_size):
    if family == "vit":
        cin, patch, dim = _patch(state, "patch_embed.proj.weight", what)
        pos = need_shape(state, "pos_embed", 3, "(1, tokens, dim)", what)
        depth = count_blocks(state, "blocks.{}.attn.qkv.weight", what)
        return ViT, dict(
            image_size=grid_image_size(pos.shape[1] - 1, pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, heads=_vit_heads(arch, heads, what),
            mlp_dim=need_shape(state, "blocks.0.mlp.fc1.weight", 2, "(hidden, dim)", what).shape[0], eps=1e-6)
    cin, patch, dim = _patch(state, "stem.proj.weight", what)
    if family == "mixer":
        depth = count_blocks(state, "blocks.{}.mlp_tokens.fc1.weight", what)
        token_w = need_shape(state, "blocks.0.mlp_tokens.fc1.weight", 2, "(D_S, S)", what)
        return MLPMixer, dict(
            image_size=grid_image_size(token_w.shape[1], pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, token_mlp_dim=token_w.shape[0],
            channel_mlp_dim=need_shape(state, "blocks.0.mlp_channels.fc1.weight", 2, "(D_C, C)", what).shape[0],
            eps=1e-6)
    depth = count_blocks(state, "blocks.{}.mlp_channels.gate.proj.weight", what)
    seq_len = need_shape(state, "blocks.0.mlp_channels.gate.proj.weight", 2, "(S, S)", what).shape[0]
    return GMLP, dict(
        image_size=grid_image_size(seq_len, pair(patch), image_size, what), patch_size=patch, in_channels=cin,
        dim=dim, depth=depth,
        ffn_dim=need_shape(state, "blocks.0.mlp_channels.fc1.weight", 2, "(d_ffn, C)", what).shape[0],
        eps=1e-6,
        sgu_eps=1e-5)


def from_timm(source, arch=None, *, num_classes=None, heads=None, gelu=None, image_size=None, **config):
    """A tinymlp model holding timm weights: ``MlpMixer`` (mixer_*), gMLP (gmlp_*) or ``VisionTransformer``.

    ``source``: a mapping of names to arrays (a timm ``state_dict()``, NumPy arrays, anything
    ``np.asarray`` takes) or a path to a ``.safetensors`` or ``.npz`` file. Architecture and sizes
    are read from the names and shapes: patch size and widths from the stem, the token count
    from the token-mixing, gating or position weights, the depth from the block count, the
    class count from the head. A ViT's ``heads`` is not in its weights: pass it (or an ``arch``
    such as "vit_base_patch16_224", whose size names it).

    ``num_classes``: a head for that many classes, zero-initialised, replaces the checkpoint's
    when the counts differ (for fine-tuning). ``gelu``: "exact" (timm's, the default) or "tanh".
    Any other keyword (``eps``, ``sgu_eps``, ``dropout``, ``seed``, ...) goes to the model's
    constructor; ``image_size`` is needed only for a non-square patch grid. A file written by
    ``save_timm`` carries its tinymlp config (GELU form, eps, heads), used where no keyword
    says otherwise, so a round trip gives the same model back.
    """
    state, meta, what = load_source(source)
    return from_timm_state(state, meta, what, arch, num_classes, heads, gelu, image_size, config)


def from_timm_state(state, meta, what, arch, num_classes, heads, gelu, image_size, config):
    """``from_timm`` on a state dict already read: ``meta`` its file's metadata, ``what`` its
    name in the errors, ``config`` the other constructor keywords."""
    state = strip_prefix(state, ("module.", "model."))
    family = _family_of_timm(state, arch)
    saved = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    cls, kwargs = _timm_config(family, state, arch, heads if heads is not None else saved.get("heads"), what,
                               image_size)
    kwargs["gelu"] = gelu or saved.get("gelu", "exact")
    for name in ("eps", "sgu_eps"):
        if name in saved and name in kwargs:
            kwargs[name] = saved[name]
    has_head = "head.weight" in state
    source_classes = need_shape(state, "head.weight", 2, "(classes, dim)", what).shape[0] if has_head else None
    if num_classes is None and source_classes is None:
        raise InteropError(f"{what} has no classifier head (timm num_classes=0): pass num_classes=K")
    keep_head = has_head and (num_classes is None or num_classes == source_classes)
    kwargs.update(num_classes=source_classes if num_classes is None else int(num_classes), **config)
    model = build(cls, kwargs, what)
    table = TIMM_TABLES[family](kwargs["depth"], head=keep_head)
    ignored = {"head.weight", "head.bias"} if has_head and not keep_head else set()
    load_table(model, state, table, ignored, what, f"timm {family}", convert=_to_tinymlp_layout)
    return model


# ---------------------------------------------------------------------- tinymlp -> timm
def _family_of_model(model):
    if isinstance(model, ViT):
        return "vit"
    if isinstance(model, MLPMixer):
        return "mixer"
    if isinstance(model, GMLP):
        c = model.config
        why = []
        if isinstance(model, AMLP) or c.get("attn_dim"):
            why.append("aMLP's tiny attention")
        if c.get("sgu_variant", "split") != "split":
            why.append(f"the {c['sgu_variant']!r} gating variant")
        if c.get("causal"):
            why.append("a causal gate")
        if why:
            raise InteropError(f"timm's gMLP has no counterpart for {' and '.join(why)}: only the plain "
                               "gMLP (split gate, dense or Toeplitz weights) converts")
        return "gmlp"
    raise InteropError(f"to_timm converts MLPMixer, GMLP and ViT models, not {type(model).__name__}")


def to_timm(model) -> dict:
    """The model's weights in timm's names and layouts: name -> float NumPy array.

    The result loads with ``load_state_dict(..., strict=True)`` into the matching timm model
    (``create_timm_model`` builds it). Toeplitz gMLP weights are written as the dense (S, S)
    matrices they stand for; a ViT's fixed sinusoidal position table as ``pos_embed``.
    """
    family = _family_of_model(model)
    state = dict(model.state_dict())
    if family == "gmlp" and model.config.get("toeplitz"):
        for i, block in enumerate(model.blocks):
            state.pop(f"blocks.{i}.sgu.toeplitz_weight", None)
            state[f"blocks.{i}.sgu.weight"] = as_numpy(block.sgu.spatial_weight())
    if family == "vit" and "pos_embed" not in state:
        state["pos_embed"] = as_numpy(model.pos_embed)
    patch = pair(model.config["patch_size"])
    patch_shape = (model.config["in_channels"], *patch)
    table = TIMM_TABLES[family](model.config["depth"])
    return {theirs: np.ascontiguousarray(_to_timm_layout(state[ours], layout, patch_shape))
            for ours, theirs, layout in table}


def _metadata(model):
    config = {k: v for k, v in model.config.items() if isinstance(v, (int, float, str, bool, type(None), list, tuple))}
    return {"tinymlp": json.dumps({"model": type(model).__name__, "config": config})}


def save_timm(model, path) -> None:
    """Write ``to_timm(model)`` to ``path``: a .safetensors file that timm reads, or an ``.npz``.

    The file also records the tinymlp class and config (GELU form, eps, ViT heads), which
    ``from_timm`` uses when it reads the file back. (``.npz`` needs no extra package; PyTorch
    reads it with ``{k: torch.from_numpy(v) for k, v in np.load(path).items()}``, less the
    ``__tinymlp_meta__`` entry.)
    """
    weights, meta = to_timm(model), _metadata(model)
    if Path(path).suffix.lower() == ".npz":
        blob = np.frombuffer(meta["tinymlp"].encode("utf-8"), dtype=np.uint8)
        atomic_write(path, lambda f: np.savez(f, allow_pickle=False, __tinymlp_meta__=blob, **weights),
                     what="save_timm")
        return
    save_safetensors(path, weights, metadata=meta, what="save_timm")


def _mlp_ratio(hidden, dim):
    """A float r with int(dim * r) == hidden (timm computes widths as int(dim * ratio))."""
    r = hidden / dim
    return r if int(dim * r) == hidden else (hidden + 0.5) / dim


def create_timm_model(model):
    """The timm model (PyTorch, eval mode) that holds this model's weights and computes its logits.

    Needs torch and timm. Built with ``pretrained=False`` (nothing is downloaded), then loaded
    strictly with ``to_timm(model)``. The GELU form and the LayerNorm eps follow the model's
    config, so the logits match tinymlp's to float32 round-off.
    """
    import functools

    try:
        import torch
        from timm.layers import GatedMlp
        from timm.models.mlp_mixer import MlpMixer, SpatialGatingBlock
        from timm.models.vision_transformer import VisionTransformer
    except ImportError as err:
        missing = getattr(err, "name", None) or "torch"
        raise ImportError(f"create_timm_model builds a PyTorch model and needs torch and timm ({missing} is not "
                          "installed): pip install torch timm; to move weights without them, use to_timm(model) "
                          "or save_timm(model, path)") from None

    family = _family_of_model(model)
    c = model.config
    act = functools.partial(torch.nn.GELU, approximate="tanh" if c.get("gelu", "tanh") == "tanh" else "none")
    norm = functools.partial(torch.nn.LayerNorm, eps=c.get("eps", 1e-6))
    common = dict(img_size=c["image_size"], patch_size=c["patch_size"], in_chans=c["in_channels"],
                  num_classes=c["num_classes"], norm_layer=norm, act_layer=act)
    if family == "vit":
        net = VisionTransformer(embed_dim=c["dim"], depth=c["depth"], num_heads=c["heads"],
                                mlp_ratio=_mlp_ratio(c["mlp_dim"], c["dim"]), qkv_bias=True, **common)
    elif family == "mixer":
        net = MlpMixer(embed_dim=c["dim"], num_blocks=c["depth"],
                       mlp_ratio=(_mlp_ratio(c["token_mlp_dim"], c["dim"]), _mlp_ratio(c["channel_mlp_dim"], c["dim"])),
                       **common)
    else:
        net = MlpMixer(embed_dim=c["dim"], num_blocks=c["depth"], mlp_ratio=_mlp_ratio(c["ffn_dim"], c["dim"]),
                       block_layer=SpatialGatingBlock, mlp_layer=GatedMlp, **common)
        gate_eps = c["sgu_eps"] if c.get("sgu_eps") is not None else c.get("eps", 1e-6)
        for block in net.blocks:   # timm's gate norm is a plain nn.LayerNorm (eps 1e-5): set tinymlp's
            block.mlp_channels.gate.norm.eps = gate_eps
    weights = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in to_timm(model).items()}
    net.load_state_dict(weights, strict=True)
    return net.eval()
