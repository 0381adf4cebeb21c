"""benchmarks/cpu_step.py runs (tiny sizes, ``--quick``): its figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # runs the benchmark scripts: not in the everyday suite

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_step.py"


@pytest.mark.parametrize("extra", [[], ["--solo"]], ids=["one-process", "solo"])
def test_cpu_step_benchmark_runs_and_reports_both_tiers(extra):
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "mixer_mnist,amlp_mnist",
                          "--runs", "fast,reference,matmul", *extra],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    for expected in ("CPU ", "NumPy ", "compiled kernels", "fast ms", "reference ms", "mixer_mnist", "amlp_mnist"):
        assert expected in out.stdout, (expected, out.stdout)


@pytest.mark.parametrize("extra", [["--runs", "fast,matmul"], ["--runs", "fast", "--solo"]],
                         ids=["one-process", "solo"])
def test_cpu_step_profile_names_the_ops_and_the_floor(extra):
    """Each op's own matrix products beside its time, also where no matmul run is timed (--solo)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "amlp_mnist", "--profile", *extra],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    for expected in ("where the fast step's time goes", "Linear fwd", "SpatialGating bwd", "Attention fwd",
                     "backward: engine", "optimizer step", "matrix products alone", "whole step", "products",
                     "rest = ms - products", "apply: in-place guard", "apply: hand-overs", "apply: graph node",
                     "engine: gradient checks", "engine: graph walk"):
        assert expected in out.stdout, (expected, out.stdout)


def test_guard_cost_switches_the_guard_off_and_back_on():
    """benchmarks/guard_cost.py compares a step with the in-place guard and without it: its
    'guard off' must really let a change of a saved input through, and restore the guard after."""
    import numpy as np

    import tinymlp

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import guard_cost
    finally:
        sys.path.remove(str(SCRIPT.parent))

    def changed_after_save():
        x = tinymlp.tensor(np.linspace(0.5, 2.0, 6), requires_grad=True)
        y = (x * x).sum()
        with tinymlp.no_grad():
            x += 1.0
        y.backward()

    with guard_cost.guard_off():
        changed_after_save()                      # unguarded: no error, a wrong gradient
    with pytest.raises(RuntimeError, match="modified in place"):
        changed_after_save()
    out = subprocess.run([sys.executable, str(SCRIPT.parent / "guard_cost.py"), "--models", "mixer_mnist",
                          "--steps", "1", "--warmup", "0"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "guard on" in out.stdout and "mixer_mnist" in out.stdout


def test_cpu_step_splits_the_gap_to_pytorch_into_products_and_the_rest():
    """The split adds up to fast - torch, each part from its own pair of runs; a missing run gives
    no split (PyTorch is not a dependency: without it the torch runs are skipped, said once)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import cpu_step
    finally:
        sys.path.remove(str(SCRIPT.parent))
    ms = {"fast": 650.0, "torch": 570.0, "matmul": 440.0, "torch-matmul": 370.0}
    products, rest = cpu_step.gap_split(ms)
    assert products == 70.0 and rest == (650.0 - 440.0) - (570.0 - 370.0)
    assert products + rest == ms["fast"] - ms["torch"]
    assert cpu_step.gap_split({k: v for k, v in ms.items() if k != "torch-matmul"}) is None
    assert cpu_step.own_work_ratio(ms) == (650.0 - 440.0) / (570.0 - 370.0)
    assert cpu_step.own_work_ratio({k: v for k, v in ms.items() if k != "matmul"}) is None
    assert cpu_step.own_work_ratio({**ms, "torch-matmul": 600.0}) is None    # no own time to divide by

    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "mixer_mnist",
                          "--runs", "fast,torch,matmul,torch-matmul"], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        import torch  # noqa: F401
    except ImportError:
        assert "the torch runs are skipped" in out.stdout
        assert "torch-matmul ms" not in out.stdout
    else:
        assert "torch-matmul ms" in out.stdout and "where fast - torch comes from" in out.stdout


def test_step_toggles_switch_each_saving_off_and_back_on():
    """benchmarks/step_toggles.py: inside each toggle's 'off' the feature's hook declines (the GELU
    takes no pending bias, AdamW's whole step declines); outside, the hooks are back."""
    import numpy as np

    import tinymlp
    import tinymlp.functional as F
    from tinymlp import fast
    from tinymlp.fast import compiled, optim
    from tinymlp.fast.engine import PendingBias

    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import step_toggles
    finally:
        sys.path.remove(str(SCRIPT.parent))

    def bias_taken():
        rng = np.random.default_rng(0)
        x, w, b = (tinymlp.tensor(v, requires_grad=True) for v in
                   (rng.standard_normal((4, 8)), rng.standard_normal((8, 8)), rng.standard_normal(8)))
        with fast.enabled():
            h = F.linear(x, w, b)
            F.gelu(h)
        return isinstance(h, PendingBias) and h.bias is not None     # the GELU took it: h still lacks it

    if compiled.available():
        assert bias_taken()
        with step_toggles.TOGGLES["pending-bias"]():
            assert not bias_taken()
        assert bias_taken()
    whole = vars(optim.CompiledFlatStep)["whole_step"]
    with step_toggles.TOGGLES["whole-adam"]():
        assert not optim.CompiledFlatStep.whole_step(None, None, None, None, 1, 1.0)
    assert vars(optim.CompiledFlatStep)["whole_step"] is whole


@pytest.mark.parametrize("toggle", ["guard-frees", "pending-bias", "whole-adam"])
def test_step_toggles_runs(toggle):
    script = SCRIPT.parent / "step_toggles.py"
    out = subprocess.run([sys.executable, str(script), "--toggle", toggle, "--quick", "--models", "gmlp_mnist"],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gmlp_mnist" in out.stdout and "on - off" in out.stdout, out.stdout
