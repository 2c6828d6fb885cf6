"""The shape of the package (compiler/README.md, docs/architecture.md): imports go down the
pipeline and never round in a circle, and modules and functions stay short enough to read.

Every module under compiler/ is parsed with `ast`; its imports, those inside functions too,
make the graph."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "compiler"

# The stages in the order an estimate runs them, each with the modules that belong to it.
STAGES = (
    ("load", ("compiler.pipeline.load", "compiler.pipeline.json_path", "compiler.pipeline.strict_yaml")),
    ("validate", ("compiler.pipeline.validate",)),
    (
        "resolve",
        ("compiler.pipeline.resolve", "compiler.pipeline.vocabulary", "compiler.pipeline.gpus", "compiler.pipeline.zero_config", "compiler.pipeline.placement"),
    ),
    ("peft", ("compiler.pipeline.peft",)),
    ("expand", ("compiler.pipeline.expand", "compiler.pipeline.formula_context")),
    ("admit", ("compiler.pipeline.admit",)),
    ("evaluate", ("compiler.pipeline.evaluate",)),
    ("simulate", ("compiler.pipeline.simulate", "compiler.pipeline.replay", "compiler.pipeline.orders", "compiler.pipeline.walks")),
    ("render", ("compiler.pipeline.render",)),
)
# What every stage may read besides the stages before it: diagnostics, data paths, the cache
# of checked inputs, the memory models and the formula registry (and its shipped libraries).
BELOW = (
    "compiler.errors",
    "compiler.paths",
    "compiler.checked",
    "compiler.memory",
    "compiler.library.formula",
    "compiler.library.expr_python",
    "compiler.library.shipped",
)
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module of the package that `name` (a module, or a name imported from one) is."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> set[str]:
    """The package's modules that `module` imports, anywhere in it, relative imports resolved."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join(base + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]  # NB: a submodule, else a name of `base`
        else:
            continue
        found |= {owner for owner in map(_owner, names) if owner and owner != module}
    return found


GRAPH = {m: imports(m) for m in MODULES}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other, directly or around (Tarjan's strongly
    connected components of more than one module, or a module importing itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph[v]:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _stage(module: str) -> int | None:
    return next((i for i, (_, owned) in enumerate(STAGES) for m in owned if module == m or module.startswith(m + ".")), None)


def reaching_up(graph: dict[str, set[str]]) -> list[str]:
    """'stage module -> what it must not import': a later stage, or anything but the stages
    before it and BELOW (api, cli, commands, inputs, measure, library.examples)."""
    out = []
    for module, targets in sorted(graph.items()):
        own = _stage(module)
        if own is None:
            continue
        for target in sorted(targets):
            at = _stage(target)
            below = any(target == b or target.startswith(b + ".") for b in BELOW)
            if (at is None and not below) or (at is not None and at > own):
                out.append(f"{module} -> {target}")
    return out


def test_the_graph_sees_every_import():
    # load imports the PyYAML half inside load_yaml_text only; the CLI imports api inside its verbs
    assert "compiler.pipeline.strict_yaml" in GRAPH["compiler.pipeline.load"]
    assert "compiler.api" in GRAPH["compiler.cli"]
    # relative ones of a module, of a package, and a name from a package
    assert {"compiler.pipeline.expand", "compiler.pipeline.resolve", "compiler.library.formula"} <= GRAPH["compiler.pipeline.admit"]
    assert {"compiler.pipeline.resolve", "compiler.pipeline.walks.base"} <= GRAPH["compiler.pipeline.walks"]
    assert "compiler.pipeline.walks" in GRAPH["compiler.pipeline.simulate"]


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"a"}}) == [["a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_a_stage_reaching_up_is_found():
    graph = {
        "compiler.pipeline.resolve": {"compiler.pipeline.expand", "compiler.api", "compiler.errors"},
        "compiler.pipeline.walks.zero3": {"compiler.pipeline.expand", "compiler.pipeline.render"},
        "compiler.api": {"compiler.pipeline.render"},
    }
    assert reaching_up(graph) == [
        "compiler.pipeline.resolve -> compiler.api",
        "compiler.pipeline.resolve -> compiler.pipeline.expand",
        "compiler.pipeline.walks.zero3 -> compiler.pipeline.render",
    ]


def test_no_import_circle():
    assert circles(GRAPH) == []


def test_stages_import_only_the_stages_before_them():
    assert reaching_up(GRAPH) == []


def test_every_pipeline_module_has_a_stage():
    assert [m for m in MODULES if m.startswith("compiler.pipeline.") and _stage(m) is None] == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_and_functions_are_short(module):
    source = MODULES[module].read_text(encoding="utf-8")
    assert source.count("\n") <= MAX_MODULE_LINES, f"{module}: {source.count(chr(10))} lines"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == [], module
