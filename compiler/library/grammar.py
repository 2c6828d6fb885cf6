"""The grammar of a formula expression: Jinja2's expression language cut down to what a
formula needs (formula.py's docstring), checked on its syntax tree.

Contract: `analyse(source)` returns the names an expression reads and its plain-Python
source (expr_python.py), or why it is refused or cannot be parsed, once per distinct text.
`_env()` is the Jinja2 sandbox that parses it and evaluates what the plain Python does not.
"""

from __future__ import annotations

from functools import lru_cache

from ..errors import did_you_mean
from .expr_python import FUNCTIONS, MAX_POWER_BITS, _python_of

# bytes.param/grad/optim/act depend on precision and optimizer (resolve derives them); the
# fixed dtypes are named so that a formula never carries a bare 4 or 8.
BYTES_KEYS = frozenset({"param", "grad", "optim", "act", "fp32", "int64", "bool"})


_ENV = None


def _env():
    global _ENV
    if _ENV is None:
        from jinja2 import StrictUndefined
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        class Arithmetic(ImmutableSandboxedEnvironment):
            """The sandbox with `**` bounded: 10 ** (10 ** 10) would take the machine's memory
            and hours before any check could see the number."""

            intercepted_binops = frozenset({"**"})

            def call_binop(self, context, operator, left, right):
                if (
                    operator == "**"
                    and isinstance(left, int)
                    and isinstance(right, int)
                    and abs(left) > 1
                    and right > 0
                    and right * abs(left).bit_length() > MAX_POWER_BITS
                ):
                    raise ValueError(f"{left} ** {right} has more than {MAX_POWER_BITS} bits; no memory size is that large")
                return super().call_binop(context, operator, left, right)

        _ENV = Arithmetic(undefined=StrictUndefined)
        _ENV.globals.clear()
        _ENV.globals.update(FUNCTIONS)
    return _ENV


def _parse(source: str):
    """The expression's AST, parsed the way `compile_expression` parses it."""
    from jinja2.parser import Parser

    env = _env()
    parser = Parser(env, source, state="variable")
    node = parser.parse_expression()
    if not parser.stream.eos:
        token = parser.stream.current
        raise _Refused(f"unexpected '{token.value}' after the expression")
    return node


class _Refused(Exception):
    pass


def _check_node(node, names: set[str]) -> None:
    """Allow-list walk of the AST; collects the names read."""
    from jinja2 import nodes as n

    arithmetic = (n.Add, n.Sub, n.Mul, n.Div, n.FloorDiv, n.Mod, n.Pow, n.And, n.Or)
    if isinstance(node, n.Const):
        return
    if isinstance(node, n.Name):
        names.add(node.name)
        return
    if isinstance(node, n.Getattr):
        if not (isinstance(node.node, n.Name) and node.node.name == "bytes") or node.attr.startswith("_"):
            if isinstance(node.node, n.Getattr):
                _check_node(node.node, names)  # NB: name the first refused access of a chain
            raise _Refused(f"attribute access '.{node.attr}' is not allowed; only bytes.<dtype> is")
        if node.attr not in BYTES_KEYS:
            hint = did_you_mean(node.attr, BYTES_KEYS) or f"dtypes: {', '.join(sorted(BYTES_KEYS))}"
            raise _Refused(f"unknown dtype 'bytes.{node.attr}'; {hint}")
        names.add("bytes")
        return
    if isinstance(node, arithmetic):
        _check_node(node.left, names)
        _check_node(node.right, names)
        return
    if isinstance(node, (n.Neg, n.Pos, n.Not)):
        _check_node(node.node, names)
        return
    if isinstance(node, n.Compare):
        _check_node(node.expr, names)
        for operand in node.ops:
            _check_node(operand.expr, names)
        return
    if isinstance(node, n.CondExpr):
        if node.expr2 is None:
            raise _Refused("a conditional needs an else branch: 'a if c else b'")
        for part in (node.test, node.expr1, node.expr2):
            _check_node(part, names)
        return
    if isinstance(node, n.Call):
        if not (isinstance(node.node, n.Name) and node.node.name in FUNCTIONS):
            called = f"'{node.node.name}()' is not allowed; " if isinstance(node.node, n.Name) else ""
            raise _Refused(f"{called}only these functions may be called: {', '.join(sorted(FUNCTIONS))}")
        if node.kwargs or node.dyn_args or node.dyn_kwargs:
            raise _Refused("function calls take positional arguments only")
        for arg in node.args:
            _check_node(arg, names)
        return
    kind = _REFUSED_NODES.get(type(node).__name__, type(node).__name__.lower())
    raise _Refused(f"{kind} is not allowed in a formula expression")


# Jinja2 node names in the words of a formula's author.
_REFUSED_NODES = {
    "Getitem": "subscript 'x[...]'",
    "Slice": "slice 'x[a:b]'",
    "Filter": "filter 'x | f'",
    "Test": "test 'x is ...'",
    "Concat": "string concatenation '~'",
    "List": "a list literal",
    "Tuple": "a tuple literal",
    "Dict": "a dict literal",
}


@lru_cache(maxsize=None)
def analyse(source: str) -> tuple[frozenset[str], str | None, str | None, str | None]:
    """(names read, Python source, why refused, why unparsable) of an expression's text,
    once per distinct text: the same expressions recur across formula files and libraries."""
    names: set[str] = set()
    try:
        node = _parse(source)
        _check_node(node, names)
    except _Refused as exc:
        return frozenset(), None, str(exc), None
    except Exception as exc:  # jinja2.TemplateSyntaxError and friends
        # NB: Jinja2 speaks of templates and appends "line 1"; keep its first line, in our words.
        reason = str(getattr(exc, "message", None) or exc).splitlines()[0].replace("end of template", "end of expression")
        return frozenset(), None, None, reason
    return frozenset(names), _python_of(node), None, None
