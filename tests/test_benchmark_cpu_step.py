"""benchmarks/cpu_step.py runs (tiny sizes, ``--quick``): its figures are never asserted here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_step.py"


@pytest.mark.parametrize("extra", [[], ["--solo"]], ids=["one-process", "solo"])
def test_cpu_step_benchmark_runs_and_reports_both_tiers(extra):
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "mixer_mnist,amlp_mnist",
                          "--runs", "fast,reference,matmul", *extra],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    for expected in ("CPU ", "NumPy ", "compiled kernels", "fast ms", "reference ms", "mixer_mnist", "amlp_mnist"):
        assert expected in out.stdout, (expected, out.stdout)


def test_cpu_step_profile_names_the_ops_and_the_floor():
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--models", "amlp_mnist", "--runs", "fast,matmul",
                          "--profile"], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    for expected in ("where the fast step's time goes", "Linear fwd", "SpatialGating bwd", "Attention fwd",
                     "backward: engine", "optimizer step", "matrix products alone", "whole step"):
        assert expected in out.stdout, (expected, out.stdout)
