"""tinymlp's figures show in a Jupyter notebook: a small notebook is executed in a real kernel
(nbclient) and every cell that returns or makes a figure must hold one PNG, never the text
``<Figure size ...>`` alone, and never the same picture twice."""

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # runs a notebook: not in the everyday suite

ROOT = Path(__file__).resolve().parent.parent

CELLS = [
    ("returned", "from tinymlp import plot, tensor\n"
                 "x = tensor([1.0, 2.0], requires_grad=True)\n"
                 "y = (x * x).sum()\n"
                 "plot.graph(y)"),
    ("called", "plot.graph(y)\nprint('after the call')"),
    ("assigned", "fig = plot.graph(y)"),
    ("shown again", "fig"),
    ("a loop", "for _ in range(2):\n    plot.graph(y)"),
    ("with pyplot", "import matplotlib.pyplot as plt\nplot.graph(y)"),
    ("no figure", "z = 1 + 1"),
]
EXPECTED = {"returned": 1, "called": 1, "assigned": 1, "shown again": 1, "a loop": 2, "with pyplot": 1,
            "no figure": 0}


def test_figures_display_where_a_cell_returns_or_makes_them(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "")
                                                                    .split(os.pathsep) if p]))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")   # what Jupyter sets
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for _, source in CELLS])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    for (name, _), cell in zip(CELLS, nb.cells):
        outputs = cell["outputs"]
        assert not [o for o in outputs if o.get("output_type") == "error"], (name, outputs)
        images = [o for o in outputs if "image/png" in o.get("data", {})]
        assert len(images) == EXPECTED[name], (name, [o.get("data", {}).keys() for o in outputs])
        for image in images:
            assert len(image["data"]["image/png"]) > 1000                         # a picture, base64
        texts = [o["data"]["text/plain"] for o in outputs if "text/plain" in o.get("data", {}) and
                 "image/png" not in o["data"]]
        assert not any(text.startswith("<Figure size") for text in texts), (name, texts)
    assert any("after the call" in o.get("text", "") for o in nb.cells[1]["outputs"])
