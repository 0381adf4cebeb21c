"""benchmarks/text_pair_race.py runs (tiny sizes): every contender trains and reports a line;
its accuracies are never asserted here (lesson 12 asserts the race it shows)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # runs the benchmark script: not in the everyday suite

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "text_pair_race.py"


def test_text_pair_race_runs_every_contender():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--words", "4", "--vocab", "8", "--train", "64",
                          "--dim", "8", "--attn-dim", "4", "--epochs", "1", "--seeds", "0"],
                         capture_output=True, text=True, timeout=300, check=False, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 words of 8" in out.stdout and "chance 0.25" in out.stdout
    for run in ("gmlp", "amlp", "amlp-frozen-w", "head", "head-gate", "head-ln", "head-gate-v-res", "head-gate-ln"):
        assert f"{run} seed 0:" in out.stdout, (run, out.stdout)
