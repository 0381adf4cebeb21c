"""tinymlp: a minimal deep-learning framework on NumPy (CPU) and CuPy (CUDA), written to be read.

Public surface: ``Tensor``, ``tensor``, ``no_grad``, ``Function``, ``gradcheck``, the
primitive ops (``tinymlp.exp``, ``tinymlp.concatenate``, ...), and the subpackages
``functional`` (``F``), ``nn``, ``optim``.
"""

from .backend import CudaUnavailableError, array_module, cuda_available
from .tensor import Tensor, tensor
from .autograd import Function, enable_grad, is_grad_enabled, no_grad
from .ops import (
    add, astype, concatenate, div, exp, getitem, log, matmul, max, mean, mul, neg, pow, relu,
    reshape, sigmoid, split, sqrt, stack, sub, sum, tanh, transpose, where,
)

__version__ = "0.1.0"

from .gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_grad
from . import testing  # tinymlp.testing.assert_grads: gradcheck for pytest
from . import checkpoint, fast, functional, models, nn, optim
from .nn.init import manual_seed
from . import functional as F
