"""The README's code examples run as written (a README that is true)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md example {index}", "exec"), {"__name__": "__readme__"})


def test_readme_test_command_is_what_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    command = 'pip install -e ".[test]" && python -m pytest'
    assert command in README.read_text()
    assert command in ci


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
