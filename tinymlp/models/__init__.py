"""The models of the course work, built from ``tinymlp.nn`` layers, one file each:

- ``mixer.py``: MLP-Mixer (token-mixing and channel-mixing MLPs),
- ``gmlp.py``:  gMLP (spatial gating unit) and aMLP (gMLP + tiny attention),
- ``vit.py``:   the Vision Transformer baseline,
- ``text_gmlp.py``: gMLP and aMLP on token sequences (``TextGMLP``: classification, sentence
  pairs, masked-LM and causal LM heads),
- ``presets.py``: named configurations of every model, image and text (``create("mixer_cifar")``,
  ``create("gmlp_text18")``) and their parameter counts.

Every image model maps images (B, C, H, W) to logits (B, num_classes) and starts with a zero
head, so its first loss is ln(num_classes); ``TextGMLP`` does the same from token ids (B, S).
Between the embedding and the head, tokens are (B, S, C) arrays; each forward has a shape
comment per line.
"""

from .gmlp import AMLP, GMLP, GMLPBlock
from .mixer import MLP, MixerBlock, MLPMixer
from .presets import PAPER_PARAMETERS, PRESETS, config, create, num_parameters
from .text_gmlp import TextGMLP
from .vit import ViT, ViTBlock, sinusoidal_embedding

__all__ = [
    "AMLP", "GMLP", "GMLPBlock", "MLP", "MLPMixer", "MixerBlock", "PAPER_PARAMETERS", "PRESETS",
    "TextGMLP", "ViT", "ViTBlock", "config", "create", "num_parameters", "sinusoidal_embedding",
]
