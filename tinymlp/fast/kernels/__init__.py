"""The fast tier's kernels, one file per topic and back end, beside the classes that call them:

- ``<topic>_numba.py``: loops that numba compiles for the CPU (``fast/compiled.py`` compiles
  and launches them), with the Python that hands them flat views of the arrays;
- ``<topic>_cuda.py``: CUDA source (raw kernels, or the bodies of CuPy elementwise kernels)
  with its launchers (``fast/cuda.py`` compiles and launches them).

Topics: activation (GELU), norm (LayerNorm), attention (the softmax backward), gating (the
SGU's split gate), dropout (the mask drawn in the kernel, on CUDA), loss (softmax
cross-entropy with class ids, on CUDA), optim (Adam's update;
clipping on CUDA). Each launcher computes what the
reference op's formula says (tinymlp/ops/<topic>.py, where it is derived); the fast ops'
contract tests (tests/test_fast_contract.py) and the GPU suite (tests/test_cuda.py) check them.
"""
