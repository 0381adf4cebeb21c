"""The two suites of tests/conftest.py: ``python -m pytest`` (the everyday suite) and ``python -m
pytest -m "slow or lessons"`` (the rest) are the whole suite between them, and the everyday one
keeps what it promises: every op's gradient tests, the engine, a step of each model, the command
lines' refusals."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import MOST_PROCESSES, THREADS, everyday_only, pytest_cmdline_main, runs_in_parallel

ROOT = Path(__file__).resolve().parents[1]

# what the everyday suite must hold: at least one test of each of these files
EVERYDAY_FILES = (
    "test_linear.py", "test_activation.py", "test_norm.py", "test_attention.py", "test_gating.py", "test_loss.py",
    "test_dropout.py", "test_embedding.py", "test_primitives.py", "test_engine.py", "test_tensor.py",
    "test_models.py", "test_text_models.py", "test_fast_contract.py", "test_errors.py", "test_examples.py",
    "test_gradcheck.py", "test_evaluate.py",
)


class _Config(SimpleNamespace):
    def getoption(self, name):
        return self.all


@pytest.mark.parametrize("args,markexpr,everything,everyday", [
    ([], "", False, True), (["tests"], "", False, True), (["tests/"], "", False, True),
    (["tests/test_lessons.py"], "", False, False), (["tests/test_x.py::test_y"], "", False, False),
    ([], "slow or lessons", False, False), ([], "", True, False),
])
def test_which_runs_are_the_everyday_suite(args, markexpr, everything, everyday):
    config = _Config(args=args, option=SimpleNamespace(markexpr=markexpr), all=everything)
    assert everyday_only(config) is everyday


def _options(markexpr="", **given):
    """pytest's options as a run without -n, -s, --pdb or --collect-only has them, but for ``given``."""
    return SimpleNamespace(**{"markexpr": markexpr, "numprocesses": None, "tx": [], "capture": "fd", "usepdb": False,
                              "collectonly": False, "maxprocesses": None, "dist": "no", **given})


@pytest.mark.parametrize("args,option,everything,parallel", [
    ([], _options(), False, True), (["tests"], _options("slow or lessons"), False, True),
    ([], _options(), True, True), (["-k", "linear"], _options(), False, True),
    (["tests/test_lessons.py"], _options(), False, False), (["tests/test_x.py::test_y"], _options(), True, False),
    ([], _options("cuda"), False, False), ([], _options(numprocesses=0), False, False),
    ([], _options(capture="no"), False, False), ([], _options(usepdb=True), False, False),
    ([], _options(collectonly=True), False, False),
])
def test_a_whole_suite_runs_on_every_core_and_a_named_test_in_one_process(args, option, everything, parallel,
                                                                        monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)        # as the suite's own pytest reads it
    for var in THREADS:
        monkeypatch.delenv(var, raising=False)                      # and restores them after the test
    config = _Config(args=args, option=option, all=everything)
    assert runs_in_parallel(config) is parallel
    pytest_cmdline_main(config)
    assert [os.environ.get(var) for var in THREADS] == [("1" if parallel else None)] * len(THREADS)
    assert (option.numprocesses, option.dist) == (("auto", "worksteal") if parallel else (option.numprocesses, "no"))
    assert option.maxprocesses == (MOST_PROCESSES if parallel else None)


def test_a_test_process_of_pytest_xdist_starts_none_of_its_own(monkeypatch):
    """Its command line is the suite's: read as a suite, each process would start processes, and
    each of those more."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert runs_in_parallel(_Config(args=[], option=_options(), all=False))
    assert not runs_in_parallel(_Config(args=[], option=_options(), all=False, workerinput={"workerid": "gw0"}))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")                  # a pytest that a test process starts
    assert not runs_in_parallel(_Config(args=[], option=_options(), all=False))


def test_without_pytest_xdist_every_run_is_in_one_process():
    option = _options()
    del option.numprocesses, option.tx                               # the options xdist adds
    assert not runs_in_parallel(_Config(args=[], option=option, all=False))


def _collected(*args):
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {line.strip() for line in result.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_the_everyday_suite_and_the_rest_are_the_whole_suite():
    everyday, rest, whole = _collected(), _collected("-m", "slow or lessons"), _collected("--all")
    assert everyday and rest and not everyday & rest
    assert everyday | rest == whole, sorted(whole - everyday - rest)[:10]
    files = {test.split("::")[0].split("/")[-1] for test in everyday}
    assert not set(EVERYDAY_FILES) - files, sorted(set(EVERYDAY_FILES) - files)


# ------------------------------------------------------------------- what a test may change in pytest
def _limits_set_in_pytest(source: str) -> list:
    """Where a module calls resource.setrlimit / prlimit outside a function handed to a child:
    a ``preexec_fn=`` of the same module, or the function conftest's ``with_file_size_limit`` forks."""
    import ast

    tree = ast.parse(source)
    handed = {name.id for node in ast.walk(tree) if isinstance(node, ast.Call) for kw in node.keywords
              if kw.arg == "preexec_fn" for name in ast.walk(kw.value) if isinstance(name, ast.Name)}
    handed |= {"with_file_size_limit"}
    inside = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for child in ast.walk(node):
                inside.setdefault(id(child), []).append(getattr(node, "name", "<lambda>"))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("setrlimit", "prlimit") and not handed & set(inside.get(id(node), []))]


def test_no_test_sets_a_process_limit_in_pytests_own_process():
    """A file-size or memory limit set in pytest's process also stops pytest's own report once that
    goes to a file longer than the limit (CI's log): a test sets it in a child it starts."""
    found = {path.name: lines for path in sorted((ROOT / "tests").glob("*.py"))
             if (lines := _limits_set_in_pytest(path.read_text()))}
    assert found == {}


def test_the_limit_rule_finds_a_limit_set_in_pytests_process():
    planted = ("import resource, subprocess\n"
               "def test_a():\n    resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))\n"
               "def test_b():\n    def capped():\n        resource.setrlimit(resource.RLIMIT_AS, (1, 1))\n"
               "    subprocess.run(['true'], preexec_fn=capped)\n"
               "limit = lambda n: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))\n")
    assert _limits_set_in_pytest(planted) == [3, 8]


def _marked_helpers(source: str) -> list:
    """The functions that carry a pytest mark but are not tests: a mark meant for the test below a
    helper that was put between them (the test then runs in the wrong suite)."""
    import ast

    def is_mark(node):
        target = node.func if isinstance(node, ast.Call) else node
        return isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute) \
            and target.value.attr == "mark"

    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_")
            and any(is_mark(d) for d in node.decorator_list)]


def test_every_mark_is_on_a_test():
    found = {path.name: names for path in sorted((ROOT / "tests").glob("*.py"))
             if (names := _marked_helpers(path.read_text()))}
    assert found == {}
    planted = "import pytest\n@pytest.mark.slow\ndef helper():\n    pass\n\ndef test_a():\n    pass\n"
    assert _marked_helpers(planted) == ["helper"]
