"""Pretrained weights in, models out: timm and the official JAX checkpoints, without pickle.

    model = from_timm("mixer_b16_224.safetensors")              # MLP-Mixer, gMLP or ViT, sizes inferred
    model = from_timm(timm_model.state_dict())                  # any mapping name -> array
    model = from_timm("vit.safetensors", heads=12)              # ViT: the heads are not in the weights
    model = from_jax_npz("Mixer-B_16.npz", num_classes=10)      # official vision_transformer .npz, new head
    save_timm(model, "mine.safetensors")                        # timm's names and layouts, for PyTorch
    weights = to_timm(model)                                    # the same as a dict of NumPy arrays

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

The official Flax checkpoints (google-research/vision_transformer, ``.npz``) store Dense
kernels as (in, out) already, and the stem as a conv kernel (P, P, C_in, C) ("HWIO").

Exact numerics. timm's layers use the exact GELU x Phi(x) and its gMLP gate normalises with
eps 1e-5; the official JAX models use the tanh GELU. ``from_timm`` builds models with
``gelu="exact"`` and ``sgu_eps=1e-5``, ``from_jax_npz`` with ``gelu="tanh"``, so a converted
model computes what its source computes (logits equal to float32 round-off).

No pickle. tinymlp reads ``.safetensors`` (through the optional ``safetensors`` package: the
checkout's ``interop`` extra) and ``.npz`` (``allow_pickle=False``), never a pickled
``.pth``/``.bin``: unpickling runs whatever code the file names. Convert such a file once, on
a machine where you trust it, with the command ``PickleRefusedError`` prints.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np

from .data.transforms import resize
from .models import GMLP, AMLP, MLPMixer, ViT
from .nn import Linear, init
from .nn.module import value_problem

__all__ = [
    "InteropError", "PickleRefusedError", "change_image_size", "conversion_command", "create_timm_model",
    "from_jax_npz", "from_timm", "is_flax", "load_pretrained", "load_safetensors", "read_weights",
    "replace_head", "resize_pos_embed", "save_safetensors", "save_timm", "to_timm", "weights_source",
]

SAFETENSORS_HINT = 'pip install safetensors (or pip install -e ".[interop]" from your tinymlp checkout)'
PICKLED_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl", ".pickle", ".tar")
VIT_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16}


class InteropError(ValueError):
    """Weights that tinymlp cannot map onto one of its models, with what was found and expected."""


class PickleRefusedError(InteropError):
    """A pickled PyTorch file: tinymlp never unpickles (it could run any code)."""


# ---------------------------------------------------------------------- files
def conversion_command(path) -> str:
    """The one-line command that turns a pickled PyTorch state dict into a .safetensors file."""
    src = os.fspath(path)
    dst = str(Path(src).with_suffix(".safetensors"))
    return (f"python -c \"import torch; from safetensors.torch import save_file; "
            f"sd = torch.load('{src}', map_location='cpu', weights_only=True); "
            f"sd = sd.get('state_dict', sd.get('model', sd)); "
            f"save_file({{k: v.contiguous() for k, v in sd.items()}}, '{dst}')\"")


def _refuse_pickle(path):
    raise PickleRefusedError(
        f"{path} is a pickled PyTorch file, and tinymlp never unpickles (loading a pickle runs "
        f"whatever code it names). Convert it once, on a machine where you trust the file "
        f"(needs torch and safetensors):\n  {conversion_command(path)}\n"
        f"then load the .safetensors file. (timm models from the Hugging Face hub are usually "
        f"published as model.safetensors already.)"
    )


def _sniff(path) -> str:
    """'safetensors', 'npz', 'pickle' or 'unknown', from the first bytes of the file."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[:1] == b"\x80":                       # pickle protocol 2+ opcode
        return "pickle"
    if head[:4] == b"PK\x03\x04":                 # a zip: NumPy's .npz, or torch.save's zip of pickles
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError, EOFError) as err:
            raise InteropError(f"{path} is a damaged or truncated zip/.npz file (an incomplete download?): "
                               f"{_first_line(err)}") from None
        if any(n.endswith(".pkl") for n in names):
            return "pickle"
        return "npz"
    if len(head) == 9 and head[8:9] == b"{":      # 8-byte header length, then the JSON header
        return "safetensors"
    return "unknown"


def read_weights(path) -> tuple[dict, dict]:
    """(name -> NumPy array, metadata) from a ``.safetensors`` or ``.npz`` file, without pickle.

    A pickled ``.pth``/``.bin`` (or a ``torch.save`` zip under any name) raises
    ``PickleRefusedError`` with the one-line conversion to safetensors.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such weights file: {path}")
    kind = _sniff(path)
    if kind == "pickle" or (kind == "unknown" and path.suffix.lower() in PICKLED_SUFFIXES):
        _refuse_pickle(path)
    if kind == "npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError, zlib.error) as err:
            raise InteropError(f"{path} is damaged or truncated (an incomplete download?): {_first_line(err)}") \
                from None
        meta = {}
        if "__tinymlp_meta__" in arrays:     # written by save_timm
            try:
                meta = json.loads(arrays.pop("__tinymlp_meta__").tobytes().decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                meta = None
            if not isinstance(meta, dict):
                raise InteropError(f"{path}: its __tinymlp_meta__ entry is damaged (not a JSON object)")
        return arrays, meta
    if kind == "safetensors":
        return load_safetensors(path, with_metadata=True)
    raise InteropError(f"{path}: not a .safetensors or .npz file (tinymlp reads only those two formats)")


def _safetensors_numpy():
    try:
        import safetensors.numpy as stn
        from safetensors import safe_open
    except ImportError:
        raise ImportError(f"reading and writing .safetensors needs the safetensors package: {SAFETENSORS_HINT}") \
            from None
    return stn, safe_open


def save_safetensors(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write name -> array (NumPy, or anything ``np.asarray`` takes) as a .safetensors file.

    ``metadata`` (str -> str) goes into the file's header; PyTorch loaders expect
    ``{"format": "pt"}``, which is added when missing.
    """
    stn, _ = _safetensors_numpy()
    arrays = {k: np.ascontiguousarray(_numpy(v)) for k, v in tensors.items()}
    meta = {"format": "pt", **{str(k): str(v) for k, v in (metadata or {}).items()}}
    tmp = Path(f"{os.fspath(path)}.tmp")
    stn.save_file(arrays, str(tmp), metadata=meta)
    os.replace(tmp, path)


def load_safetensors(path, with_metadata: bool = False):
    """name -> NumPy array from a .safetensors file (and its header metadata when asked).

    bfloat16 tensors (common for weights on the hub; NumPy has no bfloat16) are converted to
    float32 exactly, with a note on stderr saying so. A truncated or damaged file raises one
    ``InteropError`` naming it.
    """
    stn, safe_open = _safetensors_numpy()
    header = _safetensors_header(path)
    bf16 = sorted(k for k, v in header.items() if k != "__metadata__" and isinstance(v, dict) and v.get("dtype") == "BF16")
    try:
        if bf16:
            arrays = _read_safetensors_bf16(path, header)
        else:
            arrays = stn.load_file(str(path))
    except InteropError:
        raise
    except Exception as err:   # SafetensorError and friends: one sentence, not the Rust message alone
        raise InteropError(f"{path} is damaged or truncated (an incomplete download?): {_first_line(err)}") from None
    if bf16:
        print(f"note: {path}: {len(bf16)} bfloat16 tensor{'s' * (len(bf16) != 1)} converted to float32 "
              "(NumPy has no bfloat16; the values are exact)", file=sys.stderr)
    if not with_metadata:
        return arrays
    meta = header.get("__metadata__") if isinstance(header.get("__metadata__"), dict) else {}
    meta = {str(k): str(v) for k, v in meta.items()}
    if "tinymlp" in meta:
        try:
            extra = json.loads(meta["tinymlp"])
        except ValueError:
            extra = None
        if isinstance(extra, dict):
            meta.update(extra)
    return arrays, meta


def _first_line(err):
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                      "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def _safetensors_header(path):
    """The JSON header of a .safetensors file (8-byte little-endian length, then JSON), checked
    against the file's size; an InteropError naming the file when it is truncated or damaged."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InteropError(f"{path} is truncated ({size} bytes, less than a .safetensors header)")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise InteropError(f"{path} is truncated or damaged: its header claims {n:,} bytes, the file has "
                               f"{size - 8:,} after the length (an incomplete download?)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InteropError(f"{path}: its .safetensors header is not valid JSON (a damaged file?)") from None
    if not isinstance(header, dict):
        raise InteropError(f"{path}: its .safetensors header is not a JSON object (a damaged file?)")
    data = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise InteropError(f"{path}: tensor {name!r} has a damaged entry in the .safetensors header")
        if offsets[1] > data:
            raise InteropError(f"{path} is truncated: tensor {name!r} ends at byte {offsets[1]:,} of the data, "
                               f"which has {data:,} bytes (an incomplete download?)")
    return header


def _read_safetensors_bf16(path, header):
    """Read a .safetensors file with bfloat16 tensors in NumPy alone, bfloat16 becoming float32
    (its 16 bits are the top half of a float32: shifted left by 16, the value is exact)."""
    with open(path, "rb") as f:
        start = 8 + int.from_bytes(f.read(8), "little")
        f.seek(start)
        blob = f.read()
    arrays = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (lo, hi) = entry.get("dtype"), entry.get("shape"), entry["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InteropError(f"{path}: tensor {name!r} has a damaged shape {shape!r} in the header")
        count = math.prod(shape)
        if dtype == "BF16":
            if hi - lo != 2 * count:
                raise InteropError(f"{path}: tensor {name!r} has {hi - lo} bytes for {count} bfloat16 values")
            bits = np.frombuffer(blob, dtype="<u2", count=count, offset=lo).astype(np.uint32) << 16
            arrays[name] = bits.view(np.float32).reshape(shape)
        elif dtype in SAFETENSORS_DTYPES:
            np_dtype = np.dtype(SAFETENSORS_DTYPES[dtype])
            if hi - lo != np_dtype.itemsize * count:
                raise InteropError(f"{path}: tensor {name!r} has {hi - lo} bytes for {count} {dtype} values")
            arrays[name] = np.frombuffer(blob, dtype=np_dtype, count=count, offset=lo).reshape(shape).copy()
        else:
            raise InteropError(f"{path}: tensor {name!r} has dtype {dtype!r}, which tinymlp cannot read")
    return arrays


def _numpy(value) -> np.ndarray:
    """An array from NumPy, CuPy, a tinymlp Tensor or a torch tensor (bfloat16 becomes float32)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):       # a torch tensor, without importing torch
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":
            value = value.float()
        return value.numpy()
    data = getattr(value, "data", None)
    if data is not None and not isinstance(value, np.ndarray) and hasattr(data, "shape"):
        value = data                                           # a tinymlp Tensor
    if hasattr(value, "get") and not isinstance(value, (np.ndarray, dict)):
        value = value.get()                                    # CuPy -> NumPy
    return np.asarray(value)


def _load_source(source) -> tuple[dict, dict, str]:
    """(arrays, metadata, description) from a path or a mapping of names to arrays."""
    if isinstance(source, (str, os.PathLike)):
        arrays, meta = read_weights(source)
        return arrays, meta, os.fspath(source)
    if not hasattr(source, "items"):
        raise TypeError(f"expected a path or a mapping of names to arrays, got {type(source).__name__}")
    return {str(k): _numpy(v) for k, v in source.items()}, {}, "the state dict"


# ---------------------------------------------------------------------- name and layout tables
# A table is a list of (tinymlp name, source name, layout). Layouts:
SAME = "same"        # identical arrays
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
                 (f"{b}sgu.norm.weight", f"{m}gate.norm.weight", SAME), (f"{b}sgu.norm.bias", f"{m}gate.norm.bias", SAME),
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
            rows += [(f"{b}{ours}.weight", f"{b}{theirs}.weight", LINEAR), (f"{b}{ours}.bias", f"{b}{theirs}.bias", SAME)]
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
        name = str(arch).lower()
        for family in ("mixer", "gmlp", "vit"):
            if name == family or name.startswith(family + "_"):
                return family
        raise InteropError(f"arch={arch!r}: expected 'mixer', 'gmlp', 'vit' or a timm model name starting "
                           "with one of them (mixer_b16_224, gmlp_s16_224, vit_base_patch16_224, ...)")
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


def _need(state, key, what):
    if key not in state:
        raise InteropError(f"{what}: the weights have no {key!r}")
    return state[key]


def _depth(state, probe):
    depth = 0
    while probe.format(depth) in state:
        depth += 1
    if depth == 0:
        raise InteropError(f"no blocks found (no {probe.format(0)!r})")
    return depth


def _grid_image_size(num_tokens, patch, image_size, what):
    """Image size from a token count (a square grid) unless given."""
    if image_size is not None:
        return image_size
    side = math.isqrt(num_tokens)
    if side * side != num_tokens:
        raise InteropError(f"{what}: {num_tokens} tokens is not a square grid; pass image_size=(H, W)")
    return side * patch[0] if patch[0] == patch[1] else (side * patch[0], side * patch[1])


def _patch(weight):
    """(C, C_in, P_h, P_w) conv weight -> (C_in, patch size: int or pair, C)."""
    c, cin, ph, pw = weight.shape
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
        cin, patch, dim = _patch(_need(state, "patch_embed.proj.weight", what))
        pos = _need(state, "pos_embed", what)
        depth = _depth(state, "blocks.{}.attn.qkv.weight")
        return ViT, dict(
            image_size=_grid_image_size(pos.shape[1] - 1, _pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, heads=_vit_heads(arch, heads, what),
            mlp_dim=_need(state, "blocks.0.mlp.fc1.weight", what).shape[0], eps=1e-6)
    cin, patch, dim = _patch(_need(state, "stem.proj.weight", what))
    if family == "mixer":
        depth = _depth(state, "blocks.{}.mlp_tokens.fc1.weight")
        token_w = state["blocks.0.mlp_tokens.fc1.weight"]                 # (D_S, S)
        return MLPMixer, dict(
            image_size=_grid_image_size(token_w.shape[1], _pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, token_mlp_dim=token_w.shape[0],
            channel_mlp_dim=_need(state, "blocks.0.mlp_channels.fc1.weight", what).shape[0], eps=1e-6)
    depth = _depth(state, "blocks.{}.mlp_channels.gate.proj.weight")
    seq_len = state["blocks.0.mlp_channels.gate.proj.weight"].shape[0]    # (S, S)
    return GMLP, dict(
        image_size=_grid_image_size(seq_len, _pair(patch), image_size, what), patch_size=patch, in_channels=cin,
        dim=dim, depth=depth, ffn_dim=_need(state, "blocks.0.mlp_channels.fc1.weight", what).shape[0], eps=1e-6,
        sgu_eps=1e-5)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _strip_prefix(state, prefixes):
    for prefix in prefixes:
        if state and all(k.startswith(prefix) for k in state):
            return {k[len(prefix):]: v for k, v in state.items()}
    return state


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
    state, meta, what = _load_source(source)
    return _from_timm(state, meta, what, arch, num_classes, heads, gelu, image_size, config)


def _from_timm(state, meta, what, arch, num_classes, heads, gelu, image_size, config):
    state = _strip_prefix(state, ("module.", "model."))
    family = _family_of_timm(state, arch)
    saved = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    cls, kwargs = _timm_config(family, state, arch, heads if heads is not None else saved.get("heads"), what,
                               image_size)
    kwargs["gelu"] = gelu or saved.get("gelu", "exact")
    for name in ("eps", "sgu_eps"):
        if name in saved and name in kwargs:
            kwargs[name] = saved[name]
    has_head = "head.weight" in state
    source_classes = state["head.weight"].shape[0] if has_head else None
    if num_classes is None and source_classes is None:
        raise InteropError(f"{what} has no classifier head (timm num_classes=0): pass num_classes=K")
    keep_head = has_head and (num_classes is None or num_classes == source_classes)
    kwargs.update(num_classes=source_classes if num_classes is None else int(num_classes), **config)
    model = cls(**kwargs)
    table = TIMM_TABLES[family](kwargs["depth"], head=keep_head)
    ignored = {"head.weight", "head.bias"} if has_head and not keep_head else set()
    _load_table(model, state, table, ignored, what, f"timm {family}")
    return model


def _names(theirs):
    return theirs if isinstance(theirs, tuple) else (theirs,)


def _load_table(model, state, table, ignored, what, source_name, convert=_to_tinymlp_layout):
    """Check that ``state`` holds exactly the table's source names (less ``ignored``), convert each
    array to tinymlp's layout and load them all into ``model`` (a missing head stays zero)."""
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
    dtypes = {k: t.dtype for k, t in model._state_tensors().items()}
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
    model.load_state_dict(converted)


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
            state[f"blocks.{i}.sgu.weight"] = _numpy(block.sgu.spatial_weight())
    if family == "vit" and "pos_embed" not in state:
        state["pos_embed"] = _numpy(model.pos_embed)
    patch = _pair(model.config["patch_size"])
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
        tmp = Path(f"{os.fspath(path)}.tmp.npz")
        np.savez(tmp, allow_pickle=False, __tinymlp_meta__=blob, **weights)
        os.replace(tmp, path)
        return
    save_safetensors(path, weights, metadata=meta)


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


# ---------------------------------------------------------------------- official JAX checkpoints
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
    rows += [("norm.weight", "Transformer/encoder_norm/scale", SAME), ("norm.bias", "Transformer/encoder_norm/bias", SAME)]
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
    arrays, _, what = _load_source(path)
    return _from_jax(arrays, what, arch, num_classes, gelu, image_size, config)


def _from_jax(arrays, what, arch, num_classes, gelu, image_size, config):
    state = _strip_prefix(arrays, ("opt/target/", "params/"))
    if arch is None:
        arch = "mixer" if "stem/kernel" in state else "vit" if "embedding/kernel" in state else None
    family = _family_of_timm({}, arch) if arch is not None else None
    if family not in ("mixer", "vit"):
        raise InteropError(f"{what}: not an official Mixer (stem/kernel) or ViT (embedding/kernel) checkpoint")
    stem = state["stem/kernel" if family == "mixer" else "embedding/kernel"]
    ph, pw, cin, dim = stem.shape
    patch = ph if ph == pw else (ph, pw)
    has_head = "head/kernel" in state
    source_classes = state["head/kernel"].shape[-1] if has_head else None
    has_pre_logits = "pre_logits/kernel" in state
    if has_pre_logits and (num_classes is None or num_classes == source_classes):
        raise InteropError(f"{what} has a pre_logits layer (a tanh 'representation' before its head), which "
                           "tinymlp's ViT does not have; pass num_classes=K to drop it with the head, as the "
                           "official fine-tuning does")
    if num_classes is None and source_classes is None:
        raise InteropError(f"{what} has no head: pass num_classes=K")
    keep_head = has_head and (num_classes is None or num_classes == source_classes)
    if family == "mixer":
        depth = _depth(state, "MixerBlock_{}/token_mixing/Dense_0/kernel")
        token_w = state["MixerBlock_0/token_mixing/Dense_0/kernel"]               # (S, D_S)
        cls, kwargs = MLPMixer, dict(
            image_size=_grid_image_size(token_w.shape[0], _pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, token_mlp_dim=token_w.shape[1],
            channel_mlp_dim=state["MixerBlock_0/channel_mixing/Dense_0/kernel"].shape[1], eps=1e-6)
        table = _jax_mixer_table(depth, keep_head)
    else:
        depth = _depth(state, "Transformer/encoderblock_{}/LayerNorm_0/scale")
        pos = state["Transformer/posembed_input/pos_embedding"]
        heads = state["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"].shape[1]
        cls, kwargs = ViT, dict(
            image_size=_grid_image_size(pos.shape[1] - 1, _pair(patch), image_size, what), patch_size=patch,
            in_channels=cin, dim=dim, depth=depth, heads=heads,
            mlp_dim=state["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"].shape[1], eps=1e-6)
        table = _jax_vit_table(depth, keep_head)
    kwargs.update(num_classes=source_classes if num_classes is None else int(num_classes), gelu=gelu, **config)
    model = cls(**kwargs)
    ignored = {"head/kernel", "head/bias", "pre_logits/kernel", "pre_logits/bias"} if not keep_head else set()
    _load_table(model, state, table, ignored, what, f"official {family} checkpoint", convert=_from_flax)
    return model


# ---------------------------------------------------------------------- either source
def load_pretrained(source, *, num_classes=None, heads=None, gelu=None, image_size=None, **config):
    """A tinymlp model from timm weights or an official JAX ``.npz``, whichever ``source`` holds.

    Flax names (``stem/kernel``, ``embedding/kernel``, ...) go to ``from_jax_npz``, timm names to
    ``from_timm``; the keywords are theirs (``gelu`` defaults to each source's own form).
    """
    state, meta, what = _load_source(source)
    if is_flax(state):
        return _from_jax(state, what, None, num_classes, gelu or "tanh", image_size, config)
    return _from_timm(state, meta, what, None, num_classes, heads, gelu, image_size, config)


def weights_source(path) -> str:
    """"jax" (official Flax names), "tinymlp" (written by ``save_timm``) or "timm", from the
    names and header of a weights file alone (the arrays are not read)."""
    path = Path(path)
    kind = _sniff(path) if path.is_file() else "unknown"
    if kind == "npz":
        with np.load(path, allow_pickle=False) as npz:
            names, meta = npz.files, {"tinymlp": "1"} if "__tinymlp_meta__" in npz.files else {}
    elif kind == "safetensors":
        _, safe_open = _safetensors_numpy()
        with safe_open(str(path), framework="numpy") as f:
            names, meta = list(f.keys()), dict(f.metadata() or {})
    else:
        read_weights(path)          # raises the right error (missing, pickle, unknown format)
        names, meta = [], {}
    if "tinymlp" in meta:
        return "tinymlp"
    return "jax" if is_flax(names) else "timm"


def is_flax(state) -> bool:
    """Whether a mapping's names are Flax's (``a/b/kernel``) rather than PyTorch's (``a.b.weight``)."""
    return any("/" in k for k in state)


# ---------------------------------------------------------------------- fine-tuning helpers
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
    pos = _numpy(pos_embed)
    (gh, gw), (nh, nw) = _pair(old_grid), _pair(new_grid)
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
    size = _pair(image_size)
    c = model.config
    if size == _pair(c["image_size"]):
        return model
    if not isinstance(model, ViT):
        raise InteropError(
            f"{type(model).__name__} has weights over its {c['image_size']}-pixel patch grid (token mixing / "
            f"spatial gating sees each token position), so it fine-tunes at its pretraining resolution: use "
            f"image size {c['image_size']}, not {size[0] if size[0] == size[1] else size}")
    patch = _pair(c["patch_size"])
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
