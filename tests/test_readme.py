"""The README's code examples run as written (a README that is true)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


# an example that trains (calls fit) takes half a minute: it runs with the slow tests
EXAMPLES = [pytest.param(i, marks=pytest.mark.slow) if "fit(" in block else i for i, block in enumerate(BLOCKS)]


@pytest.mark.parametrize("index", EXAMPLES)
def test_readme_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md example {index}", "exec"), {"__name__": "__readme__"})


def test_readme_test_commands_are_what_ci_runs_and_say_how_long_they_take():
    ci = (README.parent / ".ci" / "run").read_text()
    section = TEXT[TEXT.index("## Run the tests"):TEXT.index("\n## ", TEXT.index("## Run the tests") + 5)]
    everyday, rest = 'pip install -e ".[test]" && python -m pytest', 'python -m pytest -m "slow or lessons"'
    for command in (everyday, rest):
        assert command in section and command in ci.splitlines(), command
    assert len(re.findall(r"\d+ min", section)) >= 2, "the section states both commands' times"
    assert "2-core" in section or "two cores" in section                       # and the machine


def _anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_first_screen_is_a_students():
    """Python version and a virtual environment, the minute-long run, the lessons, and only then
    CUDA and the CIFAR download; a table of contents whose links all land on a heading."""
    import configparser

    first = TEXT[:TEXT.index("## Autograd in ten lines")]
    order = [first.index(s) for s in ("python3 -m venv", "--dataset synthetic", "lessons/exercises/", "--device cuda")]
    assert order == sorted(order), order
    required = configparser.ConfigParser()
    required.read(README.parent / "setup.cfg")
    version = required["options"]["python_requires"].lstrip(">=")
    assert f"Python {version} or later" in first[:first.index("python3 -m venv")]
    contents = TEXT.splitlines()[:30]
    assert any(line.startswith("**Contents**") for line in contents)
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", TEXT, flags=re.M)}
    links = re.findall(r"\]\(#([\w\-]+)\)", TEXT)
    assert links and not [link for link in links if link not in anchors]


def test_benchmark_tables_live_in_results_md_and_the_license_is_mit():
    section = TEXT[TEXT.index("## Benchmarks"):TEXT.index("## Layout")]
    assert "|---" not in section and len(section.splitlines()) < 40
    results = (README.parent / "benchmarks" / "RESULTS.md").read_text()
    assert "## The current figures" in results and "`mixer_cifar` | 17.6 | 10.3 |" in results
    import configparser

    meta = configparser.ConfigParser()
    meta.read(README.parent / "setup.cfg")
    assert meta["metadata"]["license"] == "MIT"
    assert (README.parent / "LICENSE").read_text().startswith("MIT License\n")


TEXT = README.read_text()
EXAMPLE_COMMANDS = [line.strip() for line in TEXT.splitlines() if re.search(r"python examples/\w+\.py", line)]


def test_readme_smoke_runs_say_how_many_epochs():
    """A run with --limit-batches but no --epochs trains for the default 50 epochs: not a smoke run."""
    smoke = [c for c in EXAMPLE_COMMANDS if "--limit-batches" in c]
    assert smoke, "the README shows a smoke run"
    assert [c for c in smoke if "--epochs" not in c] == []


def _imports(code):
    import ast

    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module.split(".")[0]


def test_readme_one_liners_say_what_they_need():
    """Every module a ``python -c`` line imports is standard, installed with tinymlp, or named in a
    ``pip install`` of the README."""
    import sys

    installed = {"tinymlp", "numpy", "tqdm", "matplotlib"}
    named = {name.replace("-", "_") for cmd in re.findall(r"pip install ([^`\n]+)", TEXT)
             for name in cmd.split() if not name.startswith(("-", ".", '"', "'"))}
    one_liners = re.findall(r'python -c "(.*)"', TEXT)
    assert one_liners
    for code in one_liners:
        for module in _imports(code):
            assert module in sys.stdlib_module_names or module in installed or module in named, (module, code)


def test_readme_says_when_fine_tuning_keeps_the_head():
    """examples/finetune.py keeps a head of the dataset's class count and replaces any other."""
    section = TEXT[TEXT.index("**Fine-tuning on CIFAR.**"):TEXT.index("## gMLP and aMLP on text")]
    assert "kept" in section and "replaced by a zero-initialised one" in section
    assert "its own head" in section and "a new zero head" in section           # what the script prints


@pytest.mark.slow
@pytest.mark.slow
def test_readme_smoke_run_runs(tmp_path):
    import subprocess
    import sys

    command = next(c for c in EXAMPLE_COMMANDS if c.startswith("python examples/train_cifar_mixer.py")
                   and "--limit-batches" in c)
    argv = command.split()[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "smoke")
    root = README.parent
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    result = subprocess.run([sys.executable, *argv, "--no-progress"], cwd=root, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "epoch 1/1" in result.stdout and (tmp_path / "smoke" / "checkpoint.npz").is_file()
