"""Command line: ``python -m tinymlp doctor`` reports what tinymlp can run on here; ``python -m
tinymlp predict`` classifies images or texts with a trained model (``tinymlp/predict.py``);
``python -m tinymlp evaluate`` scores a trained model on labelled data: top-1 and top-5 accuracy,
per-class precision and recall, the confusion matrix (``tinymlp/evaluate.py``)."""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

from . import __version__, backend


def _blas_info() -> str:
    """Name and version of the BLAS NumPy was built with (where NumPy says)."""
    try:
        config = np.show_config(mode="dicts")
        blas = config.get("Build Dependencies", {}).get("blas", {})
        name = blas.get("name", "unknown")
        version = blas.get("version", "")
        return f"{name} {version}".strip()
    except Exception:  # older NumPy or an unusual build
        return "unknown"


def _thread_env() -> str:
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE")
    set_vars = [f"{k}={os.environ[k]}" for k in keys if k in os.environ]
    return ", ".join(set_vars) if set_vars else "none set"


def _tiny_op(device: str) -> str:
    """Run a small matmul + tanh forward and backward through tinymlp on ``device``; compare with NumPy."""
    from . import tensor

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16)), rng.standard_normal((16, 4))
    x = tensor(a, device=device, dtype="float64", requires_grad=True)
    y = (x @ tensor(b, device=device, dtype="float64")).tanh().sum()
    y.backward()
    expected = np.tanh(a @ b).sum()
    ok = abs(y.item() - expected) < 1e-9 and x.grad is not None
    return "ok" if ok else f"WRONG RESULT ({y.item()} vs {expected})"


def _cpu_kernels() -> str:
    """Which fast-tier kernels a CPU step runs here: numba's compiled ones or the NumPy path."""
    import tinymlp.fast
    from tinymlp.fast import compiled

    if not tinymlp.fast.is_enabled():
        return "fast tier off (TINYMLP_FAST=0 or tinymlp.fast.disabled()): reference tier only"
    return f"fast tier on; compiled kernels: {compiled.describe()}"


def doctor() -> int:
    """Print what tinymlp can run on here, ending with a one-line verdict; 0 when the CPU path works."""
    print(f"tinymlp {__version__}")
    print(f"python  {platform.python_version()} ({sys.executable})")
    print(f"numpy   {np.__version__}, BLAS: {_blas_info()}, CPU cores: {os.cpu_count()}, "
          f"thread variables: {_thread_env()}")
    try:
        cpu = _tiny_op("cpu")
    except Exception as exc:
        cpu = f"FAILED ({type(exc).__name__}: {exc})"
    print(f"cpu     tiny op: {cpu}")
    print(f"kernels {_cpu_kernels()}")
    cpu_verdict = "CPU ready" if cpu == "ok" else f"CPU NOT WORKING (tiny op: {cpu})"
    status = 0 if cpu == "ok" else 1

    count, finding, advice = backend.cuda_status()
    cupy = backend.cupy_module()
    print(f"cupy    {cupy.__version__}" if cupy is not None else f"cupy    {finding}")
    if count == 0:
        if cupy is not None:
            print(f"cuda    {finding}")
        print(f"        {advice}")
        print(f"{cpu_verdict}; CUDA: {finding}")
        return status
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    driver = cupy.cuda.runtime.driverGetVersion()
    print(f"cuda    runtime {runtime // 1000}.{runtime % 1000 // 10}, "
          f"driver {driver // 1000}.{driver % 1000 // 10}, {count} device(s)")
    not_ready = backend.cuda_ready(cupy)   # an elementwise kernel, a matmul, the fast tier's LayerNorm
    print(f"        kernels: {'ok' if not_ready is None else 'FAILED: ' + not_ready}")
    if not_ready is not None:
        print(f"        {backend.INSTALL_CUPY}")
        print(f"{cpu_verdict}; CUDA: NOT READY: {not_ready}")
        return status
    from .fast import cuda
    fallback = cuda.kernel_failure(np.float32)
    if fallback is not None:
        print(f"        the fast tier's CUDA kernels do not compile ({fallback}): its array code runs instead (slower)")
    for index in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        memory = props["totalGlobalMem"] / 2**30
        if index == 0:                                   # the GPU that device="cuda" means
            try:
                result = _tiny_op("cuda")
            except Exception as exc:
                result = f"FAILED ({type(exc).__name__}: {exc})"
            ok = result == "ok"
            result = f"tiny op: {result}"
        else:
            result = f"(to use it: CUDA_VISIBLE_DEVICES={index})"
        label = "cuda" if index == 0 else f"GPU {index}"
        print(f"  {label:7s} {name}, {memory:.1f} GiB, compute {props['major']}.{props['minor']}: {result}")
    gpu_verdict = (f"ready (device 'cuda' = GPU 0 of {count})" if ok
                   else "GPU 0 FAILED the tiny op (see above)")
    print(f"{cpu_verdict}; CUDA: {gpu_verdict}")
    return status


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["predict"]:                      # its own flags: tinymlp/predict.py
        from .predict import main as predict
        return predict(argv[1:])
    if argv[:1] == ["evaluate"]:                     # its own flags: tinymlp/evaluate.py
        from .evaluate import main as evaluate
        return evaluate(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m tinymlp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="print NumPy/BLAS, CuPy, the CUDA devices seen, and run a tiny op on each")
    sub.add_parser("predict", help="classify images or texts with a trained model (predict --help)")
    sub.add_parser("evaluate", help="top-1/top-5 accuracy, per-class precision and recall and the confusion "
                                    "matrix of a trained model on its test set or other labelled data "
                                    "(evaluate --help)")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    return 2


if __name__ == "__main__":
    sys.exit(main())
