"""Shared test configuration: the everyday suite and the rest, hypothesis profiles, the device
fixture, the cuda marker, and the environment of the processes a test starts (``checkout_env``).

Two suites. ``python -m pytest`` runs the everyday suite: every test not marked ``slow`` or
``lessons`` (every op's gradient checks on both tiers, the engine, the layers, a step of each
model, the data and checkpoint code, the command lines' refusals). ``python -m pytest -m "slow or
lessons"`` runs the rest (the notebooks, the grader's planted answers, whole training runs of the
example scripts, the CuPy stand-in's steps, long property runs); together the two are the whole
suite, which ``--all`` runs in one go. A ``-m`` expression of your own, or a test file or test
named on the command line (``pytest tests/test_lessons.py``), runs what it selects, marked or not.

A suite (the everyday one, the rest, ``--all``) runs on every core, through pytest-xdist: one
process per core, each with one BLAS and numba thread, the tests handed out as processes come
free (``--dist worksteal``). A file or a test named, ``-s``, ``--pdb``, or ``-n 0`` run in this
process alone; ``-n N`` chooses the number of processes.

Profiles (select with HYPOTHESIS_PROFILE=dev|ci|nightly; CI=true selects "ci"):
gradient checks are finite-difference loops, so deadlines are off everywhere.
"""

import os
import pathlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import tinymlp

settings.register_profile("dev", max_examples=15, deadline=None)
settings.register_profile(
    "ci",
    max_examples=15,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors],
)
settings.register_profile("nightly", max_examples=500, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

CUDA = tinymlp.cuda_available()


NOT_EVERYDAY = ("slow", "lessons")
"""The markers of the tests the everyday suite leaves to ``-m "slow or lessons"``."""


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="run the whole suite: the everyday tests and those marked slow or lessons")


def everyday_only(config) -> bool:
    """Whether this run is the everyday suite: no ``-m``, no ``--all``, and no test file or test
    named on the command line (a folder, or nothing, is the suite)."""
    if config.getoption("--all") or config.option.markexpr:
        return False
    named = [arg for arg in config.args if "::" in arg or arg.split("::")[0].endswith(".py")]
    return not named


WHOLE_SUITES = ("slow or lessons",)
"""The ``-m`` expressions that select a whole suite (the rest), run on every core like the everyday one."""

MOST_PROCESSES = 8
"""At most this many test processes however many cores (each holds a few hundred MB)."""

THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
"""The thread counts a test process inherits as 1 (unless set): one process per core already."""


def runs_in_parallel(config) -> bool:
    """Whether this run hands its tests to one process per core: a whole suite (the everyday one,
    the rest, ``--all``), pytest-xdist installed, and no ``-n``, ``-s``, ``--pdb`` or ``--collect-only``.
    Never in a test process of pytest-xdist, which reads the same command line (nor in a pytest
    that a test of one starts): each would start processes of its own."""
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    option = config.option
    if getattr(option, "numprocesses", 0) is not None or getattr(option, "tx", None):
        return False                                # xdist missing (no option), or -n / --tx given
    if option.capture == "no" or option.usepdb or option.collectonly:
        return False
    suite = config.getoption("--all") or option.markexpr in WHOLE_SUITES
    named = [arg for arg in config.args if "::" in arg or arg.split("::")[0].endswith(".py")]
    return (suite or everyday_only(config)) and not named


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """A whole suite runs on every core (before pytest-xdist reads its options). The thread counts
    are set here, in the environment the test processes start with: NumPy and numba read them at
    import, which in a test process comes before this file (setup.cfg's filterwarnings names a
    tinymlp class)."""
    if runs_in_parallel(config):
        for var in THREADS:
            os.environ.setdefault(var, "1")
        config.option.numprocesses = "auto"
        config.option.maxprocesses = MOST_PROCESSES
        config.option.dist = "worksteal"


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_WorkersLeftForLater(), "tinymlp-left-for-later")


class _WorkersLeftForLater:
    """Under pytest-xdist the test processes collect and deselect: each reports how many tests it
    left for later, and the summary line below says it as for a run in one process."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        left = getattr(node, "workeroutput", {}).get("left_for_later", 0)
        node.config.stash[_LEFT_FOR_LATER] = max(left, node.config.stash.get(_LEFT_FOR_LATER, 0))


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):    # a test process of pytest-xdist: tell the main one
        session.config.workeroutput["left_for_later"] = session.config.stash.get(_LEFT_FOR_LATER, 0)


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="no CUDA device visible to CuPy")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip_cuda)
    if everyday_only(config):
        rest = [item for item in items if any(item.get_closest_marker(m) for m in NOT_EVERYDAY)]
        if rest:
            left = set(map(id, rest))
            items[:] = [item for item in items if id(item) not in left]
            config.hook.pytest_deselected(items=rest)
            config.stash[_LEFT_FOR_LATER] = len(rest)


_LEFT_FOR_LATER = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    left = config.stash.get(_LEFT_FOR_LATER, 0)
    if left:
        terminalreporter.write_line(f"the everyday suite: {left} tests marked slow or lessons were left out; "
                                    'python -m pytest -m "slow or lessons" runs them (--all: everything)')


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.fixture(params=DEVICES)
def device(request):
    """Run a test once per device; the CUDA run is skipped where no GPU is usable."""
    return request.param


@pytest.fixture(params=["fast", "reference"])
def tier(request):
    """Run a test once with the fast tier on and once on the reference tier alone.

    Op test modules use it for every test (``pytestmark = pytest.mark.usefixtures("tier")``),
    so every gradient check and every planted bug runs against both implementations.
    """
    with tinymlp.fast.enabled() if request.param == "fast" else tinymlp.fast.disabled():
        yield request.param


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def checkout_env(monkeypatch):
    """Processes the test starts (notebook kernels, the grader's workers) import this checkout's
    tinymlp and use one BLAS thread unless the environment says otherwise: the lessons' arrays are
    small, and several processes on a two-core CI machine would thrash in the BLAS spin-waits."""
    root = pathlib.Path(__file__).resolve().parent.parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, os.environ.get(var, "1"))


@pytest.fixture
def with_file_size_limit():
    """with_file_size_limit(n, fn) -> fn(), run in a forked child whose files stop at n bytes
    (EFBIG, as on a full disk); the child sees the test's monkeypatches and fixtures as they are.

    A process limit is set in a child, never in pytest's own process: there it would also stop
    pytest's report whenever that goes to a file longer than n bytes (a CI log). An exception in
    fn fails the test with the child's traceback; fn returns what the test checks (a message, an
    exit status, captured output), which must pickle."""
    import pickle
    import resource
    import traceback

    def run(limit, fn):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                               # the child: limit, run, report, exit
            try:
                os.close(read)
                hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
                try:
                    payload = pickle.dumps((True, fn()))
                except BaseException:
                    payload = pickle.dumps((False, traceback.format_exc()))
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(payload)
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            payload = pipe.read()
        _, status = os.waitpid(pid, 0)
        if not payload:
            pytest.fail(f"the child with files limited to {limit} bytes ended without reporting "
                        f"(wait status {status})")
        ok, value = pickle.loads(payload)
        if not ok:
            pytest.fail(f"in the child with files limited to {limit} bytes:\n{value}", pytrace=False)
        return value

    return run
