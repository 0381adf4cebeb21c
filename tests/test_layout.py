"""The house rules of the library's layout, checked on its source with ``ast``.

One concept, one home (see DESIGN.md, "The house"). Each rule is a function over a source tree
that returns its violations as sentences; the real tree must have none, and a planted tree holds
one violation of each kind that the rules must find, so that no rule can pass by finding nothing.

- **Layers**: an import goes down the layers, never up (``LAYERS``, lowest first); the two
  upward hooks the design has are listed in ``UPWARD`` with their reasons.
- **No import circles** between modules at import time (function-level imports excluded:
  they run later, after every module has loaded).
- **The reference tier imports nothing from the fast tier**.
- **Private names stay home**: no ``from m import _x`` and no ``m._x`` of another module.
- **Globals stay home**: no assignment to (or ``setattr`` on) another module's attributes.
- **A file name repeats only across ops/, fast/ and nn/** (the same topic's reference op, fast
  implementation and layer).
- **Size caps**: the engine 300 lines, an ops/ or fast/ file 300, any library file 620
  (``CAPS``), exceptions in ``OVER_CAP`` with their reasons.
- **Comments describe the present**: no issue numbers in library text.
- **ruff** passes with the configuration in pyproject.toml.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------- the rules' data
LAYERS = [
    ("backend", "dispatch"),
    ("autograd", "contract", "grad_mode", "guard", "graph", "handover", "tensor"),
    ("ops", "functional"),
    ("fast",),
    ("nn", "optim"),
    ("models",),
    ("data", "files", "checkpoint", "interop", "train", "plot", "predict", "evaluate"),
    ("gradcheck", "testing", "lessons"),
]
"""Lowest first; a module's layer is that of its first name below ``tinymlp`` (``tinymlp.ops.norm``
-> ``ops``). The package's ``__init__`` and ``__main__`` sit above every layer (they gather the
public API and run the command line)."""

UPWARD = {
    ("tensor", "ops"): "Tensor's operators (x + y, x @ w, x.sum()) apply the ops: the one way a "
                       "tensor computes anything",
}
"""(importer's top name, imported top name) -> why this upward import is the design."""

CAPS = {"autograd.py": 300, "ops/": 300, "fast/": 300}
LIBRARY_CAP = 620
OVER_CAP: dict[str, str] = {}
"""Library file (relative to tinymlp/) -> why it may pass its cap."""

REFERENCE_TIER = ("autograd", "grad_mode", "guard", "graph", "handover", "tensor", "ops", "functional", "nn", "optim")
"""What a student reads: none of it imports the fast tier (which finds its way in through the
dispatch table and the optimizer's hook instead)."""

NAME_REPEATS_IN = ("ops", "fast", "nn")
SAME_TOPIC = {"optim.py": "the reference optimizers (optim.py) and their flat-buffer fast tier (fast/optim.py) "
                          "are one topic's two tiers, as ops/norm.py and fast/norm.py are"}
"""A file name at the package's top that its fast tier repeats -> why they are one topic."""

CIRCLE_THROUGH = {
    "tinymlp.tensor": "Tensor is the engine's data type and its operators apply the ops: autograd, guard and "
                      "contract make Tensors, and tensor.py imports them and the ops at its end, once the "
                      "class exists (the first of the two documented upward hooks)",
}
"""A module that import circles may pass through -> why (each circle must pass one of them)."""

HISTORY = re.compile(r"\bissues?\s+#?\d+|\bPR\s+#?\d+", re.IGNORECASE)


# ------------------------------------------------------------------------------- reading the tree
def library_files(root):
    """{module name: path} of every .py file under root/tinymlp."""
    pkg = Path(root) / "tinymlp"
    out = {}
    for path in sorted(pkg.rglob("*.py")):
        parts = list(path.relative_to(Path(root)).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module, node, is_package):
    """The absolute module an ImportFrom refers to (its ``from`` part)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(root):
    """(importer, imported module, lineno, top_level, names) for every import of a tinymlp module.

    ``from a.b import c`` where ``a.b.c`` is a module counts as an import of ``a.b.c``; names are
    the imported names (for the private-name rule)."""
    files = library_files(root)
    out = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        top_level = {id(n) for n in tree.body} | {
            id(n) for stmt in tree.body if isinstance(stmt, (ast.If, ast.Try))
            for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "tinymlp":
                        out.append((module, alias.name, node.lineno, id(node) in top_level, []))
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, node, is_package)
                if base.split(".")[0] != "tinymlp":
                    continue
                plain = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in files:
                        out.append((module, sub, node.lineno, id(node) in top_level, []))
                    else:
                        plain.append(alias.name)
                if plain:
                    out.append((module, base, node.lineno, id(node) in top_level, plain))
    return out


def top_name(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(module):
    name = top_name(module)
    if name in ("", "__main__"):
        return len(LAYERS)
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    return None


# ------------------------------------------------------------------------------- the rules
def layer_violations(root):
    found, unknown = [], set()
    for importer, imported, line, _, _ in imports(root):
        a, b = layer_of(importer), layer_of(imported)
        for m, layer in ((importer, a), (imported, b)):
            if layer is None and top_name(m) not in unknown:
                unknown.add(top_name(m))
                found.append(f"{m}: 'tinymlp.{top_name(m)}' has no layer: add it to LAYERS in tests/test_layout.py")
        if a is None or b is None or b <= a:
            continue
        if imported == "tinymlp" and a == len(LAYERS) - 1:
            continue          # the top layer may use the package's public API as users do
        if (top_name(importer), top_name(imported)) in UPWARD:
            continue
        found.append(f"{importer} (line {line}) imports {imported}, a higher layer "
                     f"({top_name(imported)} is above {top_name(importer)})")
    return found


def reference_imports_fast(root):
    return [f"{importer} (line {line}) imports {imported}: the reference tier does not import the fast tier"
            for importer, imported, line, _, _ in imports(root)
            if top_name(importer) in REFERENCE_TIER and top_name(imported) == "fast"]


def circles(root):
    """Import circles among modules at import time (top-level imports only)."""
    graph = {}
    for importer, imported, _, top, _ in imports(root):
        if top and importer != imported and not imported.startswith(importer + "."):
            graph.setdefault(importer, set()).add(imported)     # (a package gathering its modules
                                                                  # is not an edge of a circle)
    found, state = [], {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph.get(m, ())):
            if state.get(n) == "open":
                cycle = path[path.index(n):] + [n]
                if not set(cycle) & set(CIRCLE_THROUGH):
                    found.append(" -> ".join(cycle))
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def _module_aliases(tree, module, files, is_package):
    """Local names bound to a tinymlp module by the file's imports."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in files:
                    names[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, is_package)
            for alias in node.names:
                if f"{base}.{alias.name}" in files:
                    names[alias.asname or alias.name] = f"{base}.{alias.name}"
    return names


def _root_name(node):
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def private_and_global_violations(root):
    files = library_files(root)
    found = []
    for importer, imported, line, _, names in imports(root):
        for name in names:
            if name.startswith("_") and not name.startswith("__") and imported != importer:
                found.append(f"{importer} (line {line}) imports the private name {name} of {imported}")
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = _module_aliases(tree, module, files, path.name == "__init__.py")
        aliases = {k: v for k, v in aliases.items() if v != module}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append(f"{module} (line {node.lineno}) uses the private name {node.attr} "
                             f"of {aliases[node.value.id]}")
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and _root_name(sub) in aliases:
                        found.append(f"{module} (line {node.lineno}) assigns {ast.unparse(sub)}, "
                                     f"a global of {aliases[_root_name(sub)]}")
                        break
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and node.args and _root_name(node.args[0]) in aliases:
                found.append(f"{module} (line {node.lineno}) sets an attribute of "
                             f"{aliases[_root_name(node.args[0])]} with setattr")
    return found


def repeated_names(root):
    by_name = {}
    for path in library_files(root).values():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        by_name.setdefault(path.name, []).append(path.relative_to(Path(root) / "tinymlp"))
    found = []
    for name, paths in sorted(by_name.items()):
        if len(paths) < 2:
            continue
        dirs = {p.parts[0] if len(p.parts) > 1 else "" for p in paths}
        allowed = set(NAME_REPEATS_IN) | ({""} if name in SAME_TOPIC else set())
        if not dirs <= allowed or len(dirs) < len(paths):
            found.append(f"{name} names {len(paths)} files: {', '.join(str(p) for p in paths)} "
                         f"(a name repeats only across {', '.join(NAME_REPEATS_IN)}/)")
    return found


def cap_of(rel):
    for key, cap in CAPS.items():
        if rel == key or (key.endswith("/") and rel.startswith(key)):
            return cap
    return LIBRARY_CAP


def over_caps(root):
    found = []
    for path in library_files(root).values():
        rel = path.relative_to(Path(root) / "tinymlp").as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        cap = cap_of(rel)
        if lines > cap and rel not in OVER_CAP:
            found.append(f"tinymlp/{rel} has {lines} lines, over its cap of {cap}: split it by concept")
    return found


def history_in_comments(root):
    found = []
    for path in library_files(root).values():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(Path(root)).as_posix()}:{i} narrates history: {line.strip()[:80]}")
    return found


RULES = {
    "layers": layer_violations,
    "reference tier": reference_imports_fast,
    "circles": circles,
    "private and globals": private_and_global_violations,
    "repeated names": repeated_names,
    "caps": over_caps,
    "history": history_in_comments,
}


# ------------------------------------------------------------------------------- the real tree
@pytest.mark.parametrize("rule", list(RULES))
def test_the_library_keeps_the_house_rules(rule):
    found = RULES[rule](ROOT)
    assert not found, f"{len(found)} violation(s) of '{rule}':\n  " + "\n  ".join(found[:40])


def test_the_allowlists_name_real_exceptions():
    """Every listed exception is still needed and has its reason."""
    for (a, b), why in UPWARD.items():
        assert len(why) > 20, (a, b)
        assert any(top_name(i) == a and top_name(j) == b for i, j, *_ in imports(ROOT)), \
            f"UPWARD lists {a} -> {b}, which no module does any more: remove it"
    for name, why in SAME_TOPIC.items():
        assert (len(why) > 20 and (ROOT / "tinymlp" / name).exists()
                and (ROOT / "tinymlp" / "fast" / name).exists()), name
    for module, why in CIRCLE_THROUGH.items():
        assert len(why) > 20 and module in library_files(ROOT), module
    for rel, why in OVER_CAP.items():
        path = ROOT / "tinymlp" / rel
        assert path.exists() and len(why) > 20, rel
        assert len(path.read_text(encoding="utf-8").splitlines()) > cap_of(rel), \
            f"{rel} is back under its cap: remove it from OVER_CAP"


def test_ruff_passes():
    ruff = pytest.importorskip("ruff", reason="ruff comes with the [test] extra")
    del ruff
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "tinymlp", "tests",
                           "examples", "benchmarks", "lessons"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


# ------------------------------------------------------------------------------- planted violations
PLANTED = {
    "tinymlp/__init__.py": "from . import ops\n",
    "tinymlp/backend.py": "import numpy as np\n",
    "tinymlp/autograd.py": "from .backend import array_module\n_fast = {}\n",
    "tinymlp/ops/__init__.py": "",
    "tinymlp/ops/norm.py": "from ..nn import layers\n",                    # up: ops -> nn
    "tinymlp/ops/loss.py": "from ..autograd import _fast\n",                # a private name
    "tinymlp/fast/__init__.py": "",
    "tinymlp/fast/norm.py": "from .. import autograd\nautograd.enabled = True\n",   # another's global
    "tinymlp/fast/loss.py": "from .. import autograd\nx = autograd._fast\n",       # private attribute
    "tinymlp/nn/__init__.py": "",
    "tinymlp/nn/layers.py": "from ..fast import norm\n",
    "tinymlp/data/__init__.py": "",
    "tinymlp/data/text.py": "from . import cifar\n",                       # a circle, and a repeated name
    "tinymlp/data/cifar.py": "from . import text\n",
    "tinymlp/models/__init__.py": "",
    "tinymlp/models/text.py": "x = 1\n",
    "tinymlp/extras.py": "from . import backend\n",                        # no layer
    "tinymlp/train.py": "# as issue 17 asked\n" + "x = 1\n" * 700,         # history, over the cap
}


@pytest.fixture
def planted(tmp_path):
    for rel, text in PLANTED.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("rule,expected", [
    ("layers", ["tinymlp.ops.norm (line 1) imports tinymlp.nn.layers", "'tinymlp.extras' has no layer"]),
    ("reference tier", ["tinymlp.nn.layers (line 1) imports tinymlp.fast.norm"]),
    ("circles", ["tinymlp.data.cifar -> tinymlp.data.text -> tinymlp.data.cifar"]),
    ("private and globals", ["imports the private name _fast of tinymlp.autograd",
                             "assigns autograd.enabled, a global of tinymlp.autograd",
                             "uses the private name _fast of tinymlp.autograd"]),
    ("repeated names", ["text.py names 2 files"]),
    ("caps", ["tinymlp/train.py has 701 lines, over its cap of 620"]),
    ("history", ["tinymlp/train.py:1 narrates history"]),
])
def test_each_rule_finds_its_planted_violation(planted, rule, expected):
    found = "\n".join(RULES[rule](planted))
    for sentence in expected:
        assert sentence in found, f"'{rule}' missed: {sentence}\nit found:\n{found}"


def test_the_planted_tree_has_nothing_else_flagged_for_layers(planted):
    """fast -> ops and nn -> fast are downward: not flagged."""
    found = layer_violations(planted)
    assert not any("tinymlp.nn.layers (line" in f for f in found), found
