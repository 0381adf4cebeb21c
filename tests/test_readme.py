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
