"""Device operations per training step on CUDA, counted without a GPU, beside PyTorch eager's.

On a GPU a small step is bound by the host: every kernel launch, cuBLAS call and copy costs a few
microseconds of Python and driver time whatever its size. This counts them for tinymlp by running
the step on the CuPy stand-in of the test suite (``tests/cupy_standin.py``: NumPy underneath,
CuPy's rules on top, the fast tier's CUDA kernels emulated), which records every operation that
would reach the device: each elementwise operation, reduction, matrix product, copy, fill, upload
and kernel launch, and the line of tinymlp that asked for it. Views and ``empty`` are free.

PyTorch eager's count is the number of ATen operators of the same step (same model, weights and
batch; AdamW and clipping in their multi-tensor ``foreach`` form, as they run on CUDA) that do
work, from its CPU profiler: every operator without working operators inside it, less the views
(``view``, ``t``, ``as_strided``, ``empty``, ...), a ``_foreach_*`` operator once. It is a proxy:
on an H100 the CIFAR Mixer's step (batch 128, no clipping) ran 377 CUDA kernels under PyTorch
(its proxy here: 303; cuBLAS adds split-K reduction kernels to some products) and 543 under
tinymlp before the multi-tensor optimizer (``benchmarks/gpu_profile.py`` counts them there).

``--graph``: the same step captured into a CUDA graph (``tinymlp/fast/capture.py``, as ``fit``
runs it: two warm-up steps, the capture, then replays) and the operations the host issues for one
replayed step: the batch copied into the graph's inputs, the step's values uploaded (AdamW's
scalars, dropout seeds) and the launch. The device still runs every kernel; the host no longer
issues them one by one.

    python benchmarks/gpu_launches.py                        # the CIFAR presets (batch 16: counts barely depend on it)
    python benchmarks/gpu_launches.py --models mixer_cifar --sites 25 --clip
    python benchmarks/gpu_launches.py --graph                # and the host's operations per replayed step
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                     # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tests"))           # the CuPy stand-in
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402  (its MonkeyPatch installs and removes the stand-in)

import tinymlp  # noqa: E402
import tinymlp.functional as F  # noqa: E402
from tinymlp.fast.capture import CapturedStep  # noqa: E402
from tinymlp.models import create  # noqa: E402
from tinymlp.optim import AdamW, clip_grad_norm  # noqa: E402

TORCH_VIEWS = {
    "aten::view", "aten::t", "aten::transpose", "aten::permute", "aten::as_strided", "aten::expand",
    "aten::reshape", "aten::_reshape_alias", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select",
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::resolve_conj", "aten::resolve_neg", "aten::unflatten", "aten::flatten", "aten::_unsafe_view",
    "aten::split", "aten::chunk", "aten::narrow", "aten::result_type", "aten::size", "aten::stride",
    "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::set_", "aten::numpy_T",
    "aten::expand_as", "aten::view_as", "aten::contiguous", "aten::unbind", "aten::movedim", "aten::swapaxes",
}


def tinymlp_ops(name, batch, clip, sites, graph=False):
    """(device operations of the second step, Counter by kind, Counter by site); with ``graph``,
    also (host operations of a replayed step, Counter by kind, why it was not replayed or None)."""
    import cupy_standin

    mp = pytest.MonkeyPatch()
    try:
        cupy_standin.install(mp)
        cupy_standin.emulate(mp)
        model = create(name).to("cuda")
        optimizer = AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
        rng = np.random.default_rng(0)
        x = tinymlp.tensor(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32), device="cuda")
        y = tinymlp.tensor(rng.integers(0, 10, batch), device="cuda")

        def step():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if clip:
                clip_grad_norm(model.parameters(), 1.0, sync=False)
            optimizer.step()

        step()                                       # the first step builds the optimizer's state
        cupy_standin.OPS.reset()
        step()
        ops = cupy_standin.OPS
        eager = ops.count, Counter(ops.kinds), Counter(ops.sites)
        if not graph:
            return eager
        captured = CapturedStep(lambda a, b: step(), model.parameters(), lambda: tuple(optimizer.flat_state or ()))
        for _ in range(captured.warmup + 1):        # warm-up, then the capture and its first replay
            captured(x, y)
        ops.reset()
        captured(x, y)
        return eager + (ops.count, Counter(ops.kinds), captured.why)
    finally:
        mp.undo()
        cupy_standin.clear_kernel_caches()


def torch_ops(name, batch, clip):
    """PyTorch eager's working operators in the same step (None without PyTorch)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    from torch_models import copy_weights, torch_like

    model = create(name)
    twin = copy_weights(torch_like(model), model)
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=0.05, foreach=True)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, batch))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(twin(x), y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(twin.parameters(), 1.0, foreach=True)
        opt.step()

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(1 for e in prof.events() if _torch_working_op(e))


def _torch_working_op(event):
    """An ATen operator that does work: no working operator inside it, not a view; a multi-tensor
    ``_foreach_*`` operator counts once (on CUDA it is a few launches for all the tensors; on the
    CPU it loops over them, and what it runs inside is not counted)."""
    if not event.name.startswith("aten::") or event.name in TORCH_VIEWS:
        return False
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::_foreach"):
            return False
        parent = parent.cpu_parent
    return event.name.startswith("aten::_foreach") or not any(
        c.name.startswith("aten::") and c.name not in TORCH_VIEWS for c in event.cpu_children)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="mixer_cifar,gmlp_cifar,amlp_cifar")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="the counts do not depend on it; small is quick (default 16)")
    parser.add_argument("--clip", action="store_true", help="clip the gradients' norm, as the example scripts do")
    parser.add_argument("--sites", type=int, default=0, help="list the N lines of tinymlp that ask for the most")
    parser.add_argument("--graph", action="store_true",
                        help="also capture the step into a CUDA graph and count the host's operations per replay")
    args = parser.parse_args(argv)
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        count, kinds, sites, *replay = tinymlp_ops(name, args.batch_size, args.clip, args.sites, args.graph)
        theirs = torch_ops(name, args.batch_size, args.clip)
        rows.append((name, count, theirs, kinds, sites))
        print(f"{name:12s} tinymlp {count:5d} device operations a step   PyTorch eager "
              f"{theirs if theirs is not None else '-':>5} operators"
              + (f"   ratio {count / theirs:.2f}" if theirs else ""), flush=True)
        if replay:
            host, host_kinds, why = replay
            detail = ", ".join(f"{k} {n}" for k, n in sorted(host_kinds.items()))
            print(f"{'':12s} host operations per replayed step: {host}   (eager: {count})   [{detail}]"
                  if why is None else f"{'':12s} NOT REPLAYED ({why}): {host} host operations a step", flush=True)
    if args.sites:
        for name, _, _, kinds, sites in rows:
            print(f"\n{name}: by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common(12)))
            for (kind, site), n in sites.most_common(args.sites):
                print(f"  {n:4d}  {kind:28s} {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
