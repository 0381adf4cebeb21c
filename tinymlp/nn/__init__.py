"""``tinymlp.nn``: layers with parameters, in the manner of ``torch.nn``.

``Module`` and ``Parameter`` (module.py) hold the weights; the layers call the fused ops of
``tinymlp.functional``: layers.py (Linear, LayerNorm, GELU, Dropout, Identity, Sequential,
ModuleList, PatchEmbedding), gating.py (SpatialGatingUnit), attention.py (TinyAttention,
MultiHeadSelfAttention). ``tinymlp.nn.init`` has the seeded initialisers.

Every layer with random initial values takes ``rng``: a ``numpy.random.Generator`` or an int
seed (None = seed 0). A model passes its one Generator to all its layers, so that layers
differ from each other and the whole model is reproducible from one seed.
"""

from . import init
from .attention import MultiHeadSelfAttention, TinyAttention
from .embedding import Embedding, PositionEmbedding, TiedLMHead
from .gating import SpatialGatingUnit
from .layers import GELU, Dropout, Identity, LayerNorm, Linear, ModuleList, PatchEmbedding, Sequential
from .module import Module, Parameter, StateDictError

__all__ = [
    "Dropout", "Embedding", "GELU", "Identity", "LayerNorm", "Linear", "Module", "ModuleList",
    "MultiHeadSelfAttention", "Parameter", "PatchEmbedding", "PositionEmbedding", "Sequential",
    "SpatialGatingUnit", "StateDictError", "TiedLMHead", "TinyAttention", "init",
]
