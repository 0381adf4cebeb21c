"""Named model configurations: the papers' ImageNet models, the course work's CIFAR models and
its text models, one table and one API for all of them.

    model = create("mixer_cifar")                      # the course work's from-scratch Mixer
    model = create("mixer_b16", num_classes=10)         # any keyword overrides the preset
    model = create("gmlp_text_split", vocab_size=len(tok))   # a TextGMLP
    num_parameters("mixer_h14")                         # 432,350,952, computed without building it

ImageNet presets (224 x 224 RGB, 1000 classes) follow the tables of the course work
(Mixer: Table 1, gMLP: Table 4) and of the ViT paper (Table 1). The CIFAR presets
(32 x 32, 10 classes, 4 x 4 patches, so S = 64 tokens) follow the course work's section 2.2:
"P = 4, S = 64, C = 256, D_C = 1024, D_S = 256". The course work does not give the depth
of that Mixer nor the sizes of its CIFAR gMLP; tinymlp uses depth 8 (Mixer-S's depth) and, for
gMLP/aMLP, gMLP-Ti's widths (dim 128, d_ffn 768) at depth 8, aMLP with d_attn = 64.
(Table 5 prints 86M next to "our Mixer" and "our gMLP": the figure of ViT-B/16 a few rows up,
not of the sizes the text states, which give 4.49M for the Mixer.) ``vit_cifar`` is a ViT of the
Mixer's width and depth on the same patch grid, a baseline of similar size (6.35M).

Text presets (``TextGMLP``, token ids (B, 128)): the course work's Table 6 SGU variants at a small
scale, and the sizes of its Tables 7-9 (18 and 36 layers, C = 512, d_ffn = 3072, BERT's
30,522-piece vocabulary, S = 128), whose analytic parameter counts ``num_parameters`` reproduces:
58.5M for the 18-layer gMLP (Table 7: 59M), 101.4M for the 36-layer one (102M). Table 6's
non-split variants (92M) fit d_ffn = 2048 = 4C (the gate is not halved, so a narrower Z keeps
the size): 92.0M.
"""

from __future__ import annotations

import inspect

from .gmlp import AMLP, GMLP, gate_width
from .mixer import MLPMixer
from .text_gmlp import TextGMLP
from .vit import ViT

__all__ = ["PRESETS", "PAPER_PARAMETERS", "create", "config", "num_parameters"]

_IMAGENET = dict(image_size=224, in_channels=3, num_classes=1000)
_CIFAR = dict(image_size=32, patch_size=4, in_channels=3, num_classes=10)
_BERT_VOCAB = 30_522
_TEXT_SMALL = dict(vocab_size=8000, seq_len=128, dim=128, depth=6, num_classes=2)
_TEXT_PAPER = dict(vocab_size=_BERT_VOCAB, seq_len=128, dim=512, num_classes=2)


def _mixer(patch, dim, depth, d_s, d_c):
    return dict(_IMAGENET, patch_size=patch, dim=dim, depth=depth, token_mlp_dim=d_s, channel_mlp_dim=d_c)


def _gmlp(dim, ffn):
    return dict(_IMAGENET, patch_size=16, dim=dim, depth=30, ffn_dim=ffn)


def _vit(dim, depth, heads, mlp):
    return dict(_IMAGENET, patch_size=16, dim=dim, depth=depth, heads=heads, mlp_dim=mlp)


PRESETS = {
    # MLP-Mixer, course work Table 1: (patch, C, layers, D_S, D_C)
    "mixer_s32": (MLPMixer, _mixer(32, 512, 8, 256, 2048)),
    "mixer_s16": (MLPMixer, _mixer(16, 512, 8, 256, 2048)),
    "mixer_b32": (MLPMixer, _mixer(32, 768, 12, 384, 3072)),
    "mixer_b16": (MLPMixer, _mixer(16, 768, 12, 384, 3072)),
    "mixer_l32": (MLPMixer, _mixer(32, 1024, 24, 512, 4096)),
    "mixer_l16": (MLPMixer, _mixer(16, 1024, 24, 512, 4096)),
    "mixer_h14": (MLPMixer, _mixer(14, 1280, 32, 640, 5120)),
    # gMLP, course work Table 4: 30 layers, 16 x 16 patches, d_ffn = 6 d_model
    "gmlp_ti16": (GMLP, _gmlp(128, 768)),
    "gmlp_s16": (GMLP, _gmlp(256, 1536)),
    "gmlp_b16": (GMLP, _gmlp(512, 3072)),
    # ViT, ViT paper Table 1 (quoted in the Transformer lecture notes)
    "vit_b16": (ViT, _vit(768, 12, 12, 3072)),
    "vit_l16": (ViT, _vit(1024, 24, 16, 4096)),
    # CIFAR from scratch (course work section 2.2 and Table 5)
    "mixer_cifar": (MLPMixer, dict(_CIFAR, dim=256, depth=8, token_mlp_dim=256, channel_mlp_dim=1024)),
    "gmlp_cifar": (GMLP, dict(_CIFAR, dim=128, depth=8, ffn_dim=768)),
    "amlp_cifar": (AMLP, dict(_CIFAR, dim=128, depth=8, ffn_dim=768, attn_dim=64)),
    "vit_cifar": (ViT, dict(_CIFAR, dim=256, depth=8, heads=8, mlp_dim=1024)),  # a same-size baseline
    # text, course work Table 6 (SGU variants, MLM perplexity) at a small scale: C = 128, 6 blocks;
    # d_ffn = 4C for the unsplit gates and 6C for split, as the paper's 92M / 102M imply
    "gmlp_text_linear": (TextGMLP, dict(_TEXT_SMALL, ffn_dim=512, sgu_variant="linear")),
    "gmlp_text_additive": (TextGMLP, dict(_TEXT_SMALL, ffn_dim=512, sgu_variant="additive")),
    "gmlp_text_multiplicative": (TextGMLP, dict(_TEXT_SMALL, ffn_dim=512, sgu_variant="multiplicative")),
    "gmlp_text_split": (TextGMLP, dict(_TEXT_SMALL, ffn_dim=768, sgu_variant="split")),
    "amlp_text_split": (TextGMLP, dict(_TEXT_SMALL, ffn_dim=768, sgu_variant="split", attn_dim=64)),
    # Table 6 at full size (36 blocks, C = 512)
    "gmlp_mlm36_multiplicative": (TextGMLP, dict(_TEXT_PAPER, depth=36, ffn_dim=2048, sgu_variant="multiplicative")),
    "gmlp_mlm36_split": (TextGMLP, dict(_TEXT_PAPER, depth=36, ffn_dim=3072)),
    # Tables 7-9: the 18-layer models (d_attn = 64 for aMLP); Table 8's Toeplitz "tMLP"
    "gmlp_text18": (TextGMLP, dict(_TEXT_PAPER, depth=18, ffn_dim=3072)),
    "amlp_text18": (TextGMLP, dict(_TEXT_PAPER, depth=18, ffn_dim=3072, attn_dim=64)),
    "tmlp_text18": (TextGMLP, dict(_TEXT_PAPER, depth=18, ffn_dim=3072, toeplitz="1d")),
}

# The papers' parameter counts in millions, and whether the 1000-class head is part of them.
# The MLP-Mixer table counts the model *without* its head (it was pre-trained with 21k-class
# heads): the body alone is within 0.8% of every entry (0.2% for /16 and H/14; S/16: 18.02M
# body, 18.53M with a 1000-class head), except S/32, whose 18.59M body is printed as 19.
# gMLP's and ViT's counts include a 1000-class head (gMLP-Ti: 5.87M with it, 5.74M without;
# ViT-B/16: 86.57M with it; ViT-L/16: 304.3M against the printed 307M). The text models are
# counted without a head (Table 6: 92 unsplit, 102 split; Table 7: gMLP 18 layers 59M).
PAPER_PARAMETERS = {
    "mixer_s32": (19, False), "mixer_s16": (18, False), "mixer_b32": (60, False),
    "mixer_b16": (59, False), "mixer_l32": (206, False), "mixer_l16": (207, False),
    "mixer_h14": (431, False),
    "gmlp_ti16": (5.9, True), "gmlp_s16": (19.5, True), "gmlp_b16": (73.4, True),
    "vit_b16": (86, True), "vit_l16": (307, True),
    "gmlp_mlm36_multiplicative": (92, False), "gmlp_mlm36_split": (102, False), "gmlp_text18": (59, False),
}


def config(name, **overrides):
    """(model class, keyword arguments) of preset ``name``, with ``overrides`` applied."""
    if name not in PRESETS:
        raise KeyError(f"unknown model preset {name!r}; available: {', '.join(PRESETS)}")
    cls, kwargs = PRESETS[name]
    return cls, {**kwargs, **overrides}


def create(name, **overrides):
    """Build preset ``name``; keyword arguments override its configuration (e.g. num_classes=100)."""
    cls, kwargs = config(name, **overrides)
    return cls(**kwargs)


# ------------------------------------------------------------------ parameter arithmetic
# Counted from the configuration alone, so the 400M-parameter presets need not be allocated.
# A test checks each formula against num_parameters() of real (small) models.

def _linear(d_in, d_out, bias=True):
    return d_in * d_out + (d_out if bias else 0)


def _layer_norm(dim):
    return 2 * dim


def _stem(c):
    """Patch embedding: a Linear from a flattened P x P x C_in patch to dim, with bias."""
    return _linear(c["in_channels"] * c["patch_size"] ** 2, c["dim"])


def _num_tokens(c):
    side = c["image_size"]
    side = (side, side) if isinstance(side, int) else tuple(side)
    return (side[0] // c["patch_size"]) * (side[1] // c["patch_size"]), side


def _mixer_body(c):
    s, _ = _num_tokens(c)
    d = c["dim"]
    block = (_layer_norm(d) + _linear(s, c["token_mlp_dim"]) + _linear(c["token_mlp_dim"], s)
             + _layer_norm(d) + _linear(d, c["channel_mlp_dim"]) + _linear(c["channel_mlp_dim"], d))
    return _stem(c) + c["depth"] * block + _layer_norm(d)


def _gmlp_body(c):
    s, side = _num_tokens(c)
    d, ffn = c["dim"], c["ffn_dim"]
    variant = c.get("sgu_variant", "split")
    width = gate_width(ffn, variant)
    toeplitz = c.get("toeplitz")
    toeplitz = "2d" if toeplitz is True else (toeplitz or None)
    if toeplitz == "1d":
        spatial = 2 * s - 1
    elif toeplitz == "2d":
        gh, gw = side[0] // c["patch_size"], side[1] // c["patch_size"]
        spatial = (2 * gh - 1) * (2 * gw - 1)
    else:
        spatial = s * s
    sgu = _layer_norm(width) + spatial + s            # LN of the gated half, W, per-token bias b
    attn_dim = c.get("attn_dim")
    attn = _linear(d, 3 * attn_dim, bias=False) + _linear(attn_dim, width) if attn_dim else 0
    block = _layer_norm(d) + _linear(d, ffn) + sgu + _linear(width, d) + attn
    return _stem(c) + c["depth"] * block + _layer_norm(d)


def _vit_body(c):
    s, _ = _num_tokens(c)
    d = c["dim"]
    pos = (s + 1) * d if c.get("pos_embedding", "learned") == "learned" else 0
    block = (_layer_norm(d) + _linear(d, 3 * d) + _linear(d, d)
             + _layer_norm(d) + _linear(d, c["mlp_dim"]) + _linear(c["mlp_dim"], d))
    return _stem(c) + d + pos + c["depth"] * block + _layer_norm(d)   # d: the class token


def _text_gmlp_body(c):
    V, S, D, F = c["vocab_size"], c["seq_len"], c["dim"], c["ffn_dim"]
    width = gate_width(F, c["sgu_variant"])
    gate = width if c["sgu_variant"] == "split" else F
    spatial = {None: S * S, "1d": 2 * S - 1}[c["toeplitz"] or None]
    block = (_layer_norm(D) + _linear(D, F)                       # LN, proj_in
             + _layer_norm(gate) + spatial + S                     # SGU: LN of the gate, W, b
             + _linear(width, D))                                  # proj_out
    if c["attn_dim"]:
        a = c["attn_dim"]
        block += _linear(D, 3 * a, bias=False) + _linear(a, width)   # tiny attention: qkv (no bias), out
    total = V * D + c["depth"] * block + _layer_norm(D)           # token table, blocks, final LN
    total += 2 * D if c["segments"] else 0
    total += S * D if c["position"] == "learned" else 0
    return total


def _classifier(c):
    """The head: a Linear dim -> num_classes (none for num_classes=0)."""
    return _linear(c["dim"], c["num_classes"]) if c["num_classes"] else 0


def _text_gmlp_heads(c):
    """The classifier, and the tied LM head's own bias (its weight is the token table)."""
    return _classifier(c) + (c["vocab_size"] if c["lm_head"] else 0)


_BODY = {MLPMixer: _mixer_body, GMLP: _gmlp_body, AMLP: _gmlp_body, ViT: _vit_body, TextGMLP: _text_gmlp_body}
_HEAD = {TextGMLP: _text_gmlp_heads}


def _defaults(cls):
    """The keyword defaults of ``cls``'s constructor: what a preset leaves out."""
    return {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def num_parameters(name, include_head=True, **overrides):
    """Number of parameters of preset ``name`` (with ``overrides``), computed without building it.

    ``include_head=False`` leaves out the classifier (a Linear dim -> num_classes), and for a
    text model the LM head's bias.
    """
    cls, c = config(name, **overrides)
    c = {**_defaults(cls), **c}
    head = _HEAD.get(cls, _classifier)(c) if include_head else 0
    return _BODY[cls](c) + head
