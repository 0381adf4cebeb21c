"""The fast tier's compiled softmax and attention, the fused Linear + GELU backward and the
engine's accumulation of gradients: each against the reference (forward value and every
gradient), on the sizes and layouts the models give them, and each checked to have run.

The op-by-op contract over hypothesis shapes is tests/test_fast_contract.py (its attention and
softmax tests run the compiled classes where numba is installed); here are the cases it does not
reach: float32, arrays above ``PARALLEL_MIN`` (the parallel kernels), the exp the float32 kernel
computes, and the layout of the output.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import tinymlp.functional as F
from tinymlp import Tensor, fast
from tinymlp.ops.attention import Attention, SelfAttention, Softmax

from test_fast_contract import assert_same, laid_out, run_both

compiled = fast.compiled
needs_numba = pytest.mark.skipif(not compiled.available(), reason="numba not installed (pip install -e '.[fast]')")
TOL = {"float64": dict(rtol=1e-10, atol=1e-12), "float32": dict(rtol=2e-4, atol=2e-6)}


@pytest.fixture
def kernel_calls(monkeypatch):
    """The names of the softmax kernels that ran (``compiled.kernel`` counted)."""
    from tinymlp.fast.kernels import attention_numba

    names = {id(pair): name for name, pair in (("softmax32", attention_numba.SOFTMAX32),
                                                ("softmax64", attention_numba.SOFTMAX64),
                                                ("backward", attention_numba.SOFTMAX_BACKWARD))}
    calls = []
    original = compiled.kernel

    def counting(pair, size):
        if id(pair) in names:
            calls.append(names[id(pair)])
        return original(pair, size)

    monkeypatch.setattr(compiled, "kernel", counting)
    return calls


# --------------------------------------------------------------------------- the float32 exp
@needs_numba
def test_exp32_is_within_a_few_ulp_of_exp_and_keeps_the_edges():
    from tinymlp.fast.kernels.attention_numba import exp32

    numba = pytest.importorskip("numba")

    @numba.njit
    def apply(x, out):
        for i in range(x.shape[0]):
            out[i] = exp32(x[i])

    rng = np.random.default_rng(0)
    x = np.concatenate([-rng.exponential(8.0, 200_000), -rng.random(10_000) * 1e-6,
                        [0.0, -1e-30, -0.5, -86.6, -86.7, -100.0, -1e30, -np.inf]]).astype(np.float32)
    out = np.empty_like(x)
    apply(x, out)
    want = np.exp(x.astype(np.float64))
    normal = want > np.finfo(np.float32).tiny * 4
    rel = np.abs(out[normal] - want[normal]) / want[normal]
    assert rel.max() < 4 * np.finfo(np.float32).eps, rel.max()
    assert out[-8] == 1.0 and out[-7] == 1.0
    assert np.all(out[~normal] <= want[~normal] * 1.01) and out[-3:].tolist() == [0.0, 0.0, 0.0]
    nan = np.array([np.nan], np.float32)
    apply(nan, nan)
    assert np.isnan(nan[0])


# --------------------------------------------------------------------------- softmax, attention
@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("shape", [(3, 5, 7), (64, 64, 64)])       # the second above PARALLEL_MIN
@pytest.mark.slow
def test_compiled_softmax_matches_the_reference_and_runs(dtype, shape, kernel_calls):
    from tinymlp.fast.attention import CompiledSoftmax

    assert fast.implementation(Softmax) is CompiledSoftmax
    x = (4 * np.random.default_rng(0).standard_normal(shape)).astype(dtype)
    assert_same(run_both(lambda x: F.softmax(x, axis=-1), [x], expect=Softmax), **TOL[dtype])
    assert kernel_calls == ["softmax32" if dtype == "float32" else "softmax64", "backward"]


@needs_numba
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("masked, causal", [(False, False), (True, False), (False, True), (True, True)])
def test_compiled_self_attention_at_amlp_sizes_matches_the_reference(dtype, masked, causal, kernel_calls):
    """aMLP's tiny attention on a CIFAR batch (64 tokens, width 64, qkv token-major): the kernels
    run (parallel above PARALLEL_MIN), forward and every gradient as the reference's."""
    from tinymlp.fast.attention import CompiledSelfAttention

    assert fast.implementation(SelfAttention) is CompiledSelfAttention
    rng = np.random.default_rng(1)
    B, S, d = 64, 64, 16
    qkv = laid_out(rng, (B, S, 3 * d), "token-major").astype(dtype)
    mask = rng.random((B, S, S)) > 0.2 if masked else None
    if masked:
        mask[0, 3] = False                                   # a fully masked row: uniform P, dS = 0
    assert B * S * S >= compiled.PARALLEL_MIN
    results = run_both(lambda qkv: F.self_attention(qkv, mask=mask, causal=causal), [qkv], expect=SelfAttention)
    assert_same(results, **TOL[dtype])
    assert sorted(set(kernel_calls)) == ["backward", "softmax32" if dtype == "float32" else "softmax64"]


@given(B=st.integers(1, 4), n=st.integers(1, 9), m=st.integers(1, 9), d=st.integers(1, 5), masked=st.booleans(),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_attention_in_float32_matches_the_reference(B, n, m, d, masked, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((B, n, d), (B, m, d), (B, m, d + 2)))
    mask = rng.random((B, n, m)) > 0.3 if masked else None
    results = run_both(lambda q, k, v: F.attention(q, k, v, mask=mask, causal=causal), [q, k, v], seed,
                       expect=Attention)
    assert_same(results, **TOL["float32"])


def test_attention_output_is_laid_out_like_q():
    """Token-major qkv gives a token-major output (the projection after it reads it without a
    copy); C-order q gives C order."""
    for layout, token_major in (("token-major", True), ("C", False)):
        qkv = Tensor(laid_out(np.random.default_rng(0), (4, 6, 9), layout), dtype="float64")
        with fast.enabled():
            out = F.self_attention(qkv).data
        assert out.shape == (4, 6, 3)
        assert out.transpose(1, 0, 2).flags.c_contiguous is token_major
        assert out.flags.c_contiguous is not token_major


def test_the_numpy_softmax_steps_run_where_the_kernels_are_off(monkeypatch):
    """With the compiled kernels off, the compiled classes run FastAttention's array code."""
    before = compiled.is_enabled()
    compiled.set_enabled(False)
    try:
        def no_kernel(pair, size):
            raise AssertionError("a numba kernel ran while the compiled kernels are switched off")

        monkeypatch.setattr(compiled, "kernel", no_kernel)
        test_attention_in_float32_matches_the_reference()
        rng = np.random.default_rng(3)
        assert_same(run_both(lambda x: F.softmax(x), [rng.standard_normal((5, 7))], expect=Softmax))
    finally:
        compiled.set_enabled(before)


# --------------------------------------------------------------------------- the compile cache
def _double(x, out):
    # a kernel for the cache test: one loop that the parallel twin splits over the cores
    for i in compiled.prange(x.shape[0]):
        out[i] = 2 * x[i]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """The kernels compiled from here on use a cache folder of their own, empty at first."""
    import numba

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(compiled._state, "cache", str(tmp_path))


@needs_numba
def test_the_serial_and_the_parallel_kernel_each_load_their_own_code_from_the_cache(empty_cache):
    """numba keys its cache by function and signature, not by ``parallel=``: a pair compiled from one
    function must not share entries, or a later process loads whichever compiled first for both (a
    parallel kernel that runs on one core, or a serial one that wakes the threads on every call)."""
    x, out = np.arange(8.0), np.empty(8)
    compiled.jit(_double)[1](x, out)                       # one process compiles the parallel kernel
    serial, parallel = compiled.jit(_double)              # a later one, on the same cache
    serial(x, out)
    parallel(x, out)
    np.testing.assert_array_equal(out, 2 * x)
    assert not serial.stats.cache_hits, "the serial kernel loaded the parallel one's code"
    assert sum(serial.stats.cache_misses.values()) == 1
    assert sum(parallel.stats.cache_hits.values()) == 1, "the parallel kernel did not find its own entry"


@needs_numba
def test_a_kernel_compiled_with_other_options_does_not_load_the_old_code(empty_cache):
    """The cache key holds no compile options either: a kernel whose options changed (``reduce``, or
    a new release's settings) must compile anew, not load the code built with the old ones."""
    x, out = np.arange(8.0), np.empty(8)
    compiled.jit(_double)[0](x, out)                       # compiled and cached
    again = compiled.jit(_double)[0]                       # the same options, later
    again(x, out)
    assert sum(again.stats.cache_hits.values()) == 1, "the same options did not find their entry"
    summing = compiled.jit(_double, reduce=True)[0]       # other fastmath flags
    summing(x, out)
    np.testing.assert_array_equal(out, 2 * x)
    assert not summing.stats.cache_hits, "the kernel loaded code compiled with other options"
