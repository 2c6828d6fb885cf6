"""Every formula file's `examples:` is a test: the numbers beside the arithmetic must hold."""

import pytest

from compiler.api import library
from compiler.library.examples import evaluate_example

LIB = library()
CASES = [(f, e) for f in LIB.formulas.values() for e in f.examples]


def test_every_formula_has_examples():
    # NB: peft's ModulesToSaveWrapper owns no bytes: the compiler builds its two children from
    # the wrapped layer's formula (tests/test_lora_extras.py checks them)
    assert [f.layer_type for f in LIB.formulas.values() if not f.examples and f.layer_type != "modules_to_save"] == []


@pytest.mark.parametrize("formula,example", CASES, ids=[f"{f.layer_type}:{e.name}" for f, e in CASES])
def test_example(formula, example):
    got = evaluate_example(LIB, formula, example)
    assert {k: got[k] for k in example.expect} == dict(example.expect)


def test_linear_relations():
    """Relations between results, not just values: a trainable linear's optimizer bytes are
    6x its gradient bytes in bf16 mixed AdamW (12 / 2), and activations grow linearly in tokens."""
    f = LIB["linear"]
    from compiler.library.formula import Example

    def run(batch, trainable):
        ex = Example("x", {"d_in": 64, "d_out": 32}, {"batch": batch, "seq": 8, "trainable": trainable}, {}, "$")
        return evaluate_example(LIB, f, ex)

    one, two = run(1, True), run(2, True)
    assert one["optimizer_states"] == 6 * one["gradients"]
    assert two["activations"] == 2 * one["activations"]  # 2 * 8 * 64 * 2 = 2 * (8 * 64 * 2)
    assert run(1, False)["activations"] == 0
