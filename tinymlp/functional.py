"""The functional API (``import tinymlp.functional as F``): the fused ops with hand-derived
backward passes, one call each. Every function here is a thin entry to one ``Function`` in
``tinymlp/ops``; read that file for the forward formula and the derivation of its backward.
"""

from .ops.activation import gelu
from .ops.attention import attention, log_softmax, self_attention, softmax
from .ops.dropout import dropout
from .ops.embedding import embedding
from .ops.gating import spatial_gating, toeplitz_1d, toeplitz_2d
from .ops.linear import linear
from .ops.loss import cross_entropy
from .ops.norm import layer_norm
from .ops.shape import patchify
from .ops import relu, sigmoid, tanh

__all__ = [
    "attention", "cross_entropy", "dropout", "embedding", "gelu", "layer_norm", "linear", "log_softmax",
    "patchify", "relu", "self_attention", "sigmoid", "softmax", "spatial_gating", "tanh", "toeplitz_1d",
    "toeplitz_2d",
]
