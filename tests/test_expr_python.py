"""Formula expressions run as plain Python callables (formula.py, `_python_of`); Jinja2's
sandbox stays the reference. Every expression of the shipped library, on many scopes, gives
the same value both ways, and wherever the Python one raises, `Expr.__call__` answers as
Jinja2 does (its value or its E404)."""

import random
from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.errors import MemspecError
from compiler.library.formula import BYTES_KEYS, Expr, _callable, load_library
from compiler.paths import formulas_dir
from compiler.pipeline.load import load_yaml

ROOT = Path(__file__).resolve().parent.parent


def _exprs():
    lib = load_library(formulas_dir())
    seen = {}
    for f in lib.formulas.values():
        found = [e for _, e in f.lets] + list(f.factors.values()) + list(f.transient.values()) + list(f.param_tensors) + list(f.buffers)
        found += [s.bytes for s in f.activations + f.checkpoint]
        for c in f.children:
            found += [e for e in (c.count, c.grad_in, c.reaches_loss, c.frozen, c.when, *c.context.values(), *c.inputs.values()) if e is not None]
        for e in found:
            if isinstance(e, Expr) and e.compiled:
                seen.setdefault(e.source, e)
    return list(seen.values())


def _outcome(fn):
    from jinja2 import Undefined

    try:
        value = fn()
        return ("undefined", value._undefined_name) if isinstance(value, Undefined) else ("value", value)
    except MemspecError as exc:
        return ("error", exc.diagnostics[0].message)


def _scope(rng, names):
    pick = [0, 1, 2, 3, 7, 8, 64, 128, 1000, 4096, 32000]
    scope = {n: rng.choice(pick) for n in names}
    for n in ("trainable", "grad_flows", "grad_in", "checkpointing", "bias", "packed", "offloading", "fused_loss", "sp", "input_grads", "bias_trains"):
        if n in scope and rng.random() < 0.7:
            scope[n] = rng.random() < 0.5
    if "attention" in scope:
        scope["attention"] = rng.choice(["eager", "sdpa", "flash_attention_2"])
    scope["bytes"] = {k: rng.choice([1, 2, 4, 8, 12]) for k in BYTES_KEYS}
    return scope


def test_every_library_expression_has_python():
    exprs = _exprs()
    assert len(exprs) > 300
    assert all(e.python is not None for e in exprs)


def test_python_agrees_with_jinja_on_random_scopes():
    rng = random.Random(16)
    checked = 0
    for e in _exprs():
        for _ in range(20):
            scope = _scope(rng, e.names)
            if rng.random() < 0.1 and e.names - {"bytes"}:
                scope.pop(rng.choice(sorted(e.names - {"bytes"})))  # an undefined name: Jinja2's error
            reference = _outcome(lambda e=e, scope=scope: e.jinja(scope))
            assert _outcome(lambda e=e, scope=scope: e(scope)) == reference, e.source
            try:
                fast = _callable(e.python)(scope)
            except Exception:
                continue
            assert reference == ("value", fast), e.source
            assert type(fast) is type(reference[1]), e.source
            checked += 1
    assert checked > 5000


@pytest.mark.parametrize(
    "source, scope",
    [
        ("a // b", {"a": 1, "b": 0}),
        ("a ** b", {"a": 10, "b": 10**6}),
        ("ceil_div(a, b)", {"a": 5}),
        ("a / b", {"a": 6, "b": 4}),
        ("a if c else max(a, 3) - -a", {"a": 2, "c": False}),
        ("1 < a <= 3 and not c or a in [1]", {"a": 2, "c": True}),
    ],
)
def test_edge_cases_match(source, scope):
    from compiler.library import formula

    problems = []
    doc = load_yaml(str(ROOT / "formulas" / "linear.yaml"))
    e = formula.compile_expr(source, doc, "$", frozenset(scope) | {"b", "c"}, problems)
    assert _outcome(lambda: e(scope)) == _outcome(lambda: e.jinja(scope))


def test_golden_case_evaluates_identically(monkeypatch):
    """One whole estimate with every expression checked against Jinja2's value as it runs."""
    calls = []
    fast = Expr.__call__

    def both(self, scope):
        value = fast(self, scope)
        if self.compiled:
            assert value == self.jinja(scope) and type(value) is type(self.jinja(scope)), self.source
            calls.append(self.source)
        return value

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(Expr, "__call__", both)
    data = load_yaml("tests/cases/llava-1.5-7b-finetune/case.yaml").data
    estimate(data["file"], **(data.get("overrides") or {}))
    assert len(calls) > 500


def test_a_child_repeats_at_most_max_copies():
    """1,024 copies of a layer expand; one more is refused (E406) before any is made: a
    mistyped num_hidden_layers of 1,051,941 once took minutes and gigabytes."""
    from compiler.library.formula import MAX_COPIES, compile_expr, copies

    e = compile_expr("n_layers", load_yaml(str(ROOT / "formulas" / "linear.yaml")), "$", frozenset({"n_layers"}), [])
    assert MAX_COPIES == 1024 and copies(e, 1024, "layers") == 1024
    with pytest.raises(MemspecError) as exc:
        copies(e, 1025, "layers")
    assert exc.value.diagnostics[0].code == "E406" and "1,025 copies of 'layers'" in exc.value.diagnostics[0].message
