"""tinymlp: a minimal deep-learning framework on NumPy (CPU) and CuPy (CUDA), written to be read.

Public surface: ``Tensor``, ``tensor``, ``no_grad``, ``Function``, ``gradcheck``, the
primitive ops (``tinymlp.exp``, ``tinymlp.concatenate``, ...), and the subpackages
``functional`` (``F``), ``nn``, ``optim``.
"""

from .backend import CudaUnavailableError, array_module, cuda_available
from .tensor import Tensor, tensor
from .autograd import Function
from .grad_mode import enable_grad, is_grad_enabled, no_grad
from .ops import (
    add, astype, concatenate, div, exp, getitem, log, matmul, max, mean, mul, neg, pow, relu,
    reshape, sigmoid, split, sqrt, stack, sub, sum, tanh, transpose, where,
)

__version__ = "0.1.0"

__all__ = [
    "CudaUnavailableError", "F", "Function", "GradcheckError", "GradcheckReport", "Tensor", "add",
    "array_module", "astype", "checkpoint", "concatenate", "cuda_available", "div", "enable_grad", "exp",
    "fast", "functional", "getitem", "gradcheck", "is_grad_enabled", "log", "manual_seed", "matmul", "max",
    "mean", "models", "mul", "neg", "nn", "no_grad", "numerical_grad", "optim", "pow", "relu", "reshape",
    "sigmoid", "split", "sqrt", "stack", "sub", "sum", "tanh", "tensor", "testing", "transpose", "where",
]

from .gradcheck import GradcheckError, GradcheckReport, gradcheck, numerical_grad
from . import testing  # tinymlp.testing.assert_grads: gradcheck for pytest
from . import checkpoint, fast, functional, models, nn, optim
from .nn.init import manual_seed
from . import functional as F
