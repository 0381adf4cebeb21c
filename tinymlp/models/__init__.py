"""The models of the course work, built from ``tinymlp.nn`` layers, one file each:

- ``mixer.py``: MLP-Mixer (token-mixing and channel-mixing MLPs),
- ``gmlp.py``:  gMLP (spatial gating unit) and aMLP (gMLP + tiny attention),
- ``vit.py``:   the Vision Transformer baseline,
- ``text.py``:  gMLP and aMLP on token sequences (``TextGMLP``: classification, sentence pairs,
  masked-LM and causal LM heads) and the course work's text presets,
- ``presets.py``: named configurations (``create("mixer_cifar")``) and their parameter counts.

Every model maps images (B, C, H, W) to logits (B, num_classes) and starts with a zero head,
so its first loss is ln(num_classes). Between the patch embedding and the head, tokens are
(B, S, C) arrays; each forward has a shape comment per line.
"""

from .gmlp import AMLP, GMLP, GMLPBlock
from .mixer import MLP, MixerBlock, MLPMixer
from .presets import PAPER_PARAMETERS, PRESETS, config, create, num_parameters
from .text import TEXT_PRESETS, TextGMLP, text_create, text_num_parameters
from .vit import ViT, ViTBlock, sinusoidal_embedding

__all__ = [
    "AMLP", "GMLP", "GMLPBlock", "MLP", "MLPMixer", "MixerBlock", "PAPER_PARAMETERS", "PRESETS",
    "TEXT_PRESETS", "TextGMLP", "ViT", "ViTBlock", "config", "create", "num_parameters",
    "sinusoidal_embedding", "text_create", "text_num_parameters",
]
