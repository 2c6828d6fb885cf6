"""Formulas' allocation orders (`allocations:`) in the estimate's replay of the caching
allocator, checked against the traced step of the same record, tensor by tensor.

Eager attention (formulas/attention_core.yaml): Qwen2.5-0.5B, eager, micro-batch 4, seq 4096,
checkpointed (14 heads of 64, 2 key-value heads). One layer's scores [4, 14, 4096, 4096] are
939,524,096 elements: 1,792 MiB in bf16, 3,584 MiB in fp32; q and the repeated k and v
[4, 14, 4096, 64] are 28 MiB each.

The tanh GELU written in Python (formulas/gelu_new.yaml): Phi-2, micro-batch 1, seq 1024, its
MLP 10,240 wide: each tensor of the chain [1, 1024, 10240] in bf16 is 20 MiB."""

from pathlib import Path

import pytest

from compiler.commands.validation import record_report
from replay_events import played

ROOT = Path(__file__).resolve().parent.parent
ATTENTION = ROOT / "tests" / "measured" / "gpu" / "qwen2_2.5-0.5b_b4_s4096_eager_gc-on.json"
GELU = ROOT / "tests" / "measured" / "cpu-trace" / "phi_2_b1_s1024_sdpa_gc-off.json"
MIB = 2**20

# The trace of layer 1's attention (compiler.measure's tracer, step 2), MiB, its rotary and
# projections left out. The checkpointing unit's first forward: the repeated k and v, q's copy
# for the matmul, q @ k^T, `* scaling`, `+ mask`, the fp32 copy, softmax, the cast back (the
# softmax output and the masked scores go as nothing saves them), probs @ v and its transposed copy.
TRACED_FORWARD = [28, 28, 28, 1792, -28, 1792, -1792, 1792, -1792, 3584, 3584, -3584, 1792, -3584, -1792, 28, 28, -28]
# Its backward after the recomputation: dO, the probabilities' gradient, the saved cast freed
# (probs @ v's backward), its fp32 copy, softmax's tmp and input gradient, the saved softmax
# output freed, the cast back, `* scaling`'s gradient.
TRACED_BACKWARD = [28, 1792, -1792, 3584, -1792, 3584, 3584, -3584, -3584, -3584, 1792, -3584, 1792, -1792]


def _replayed(monkeypatch, record: Path, names: set[str]) -> list[tuple[str, int]]:
    """(name, +MiB allocated / -MiB freed) of every tensor of `names` the estimate's replay of
    `record` makes, in order."""
    events = played(monkeypatch)
    comparison, why = record_report(record)
    assert why is None
    sizes, out = {}, []
    for key, nbytes in events:
        if not (isinstance(key, tuple) and key and key[0] in ("transient", "tensor")):
            continue
        name = str(key[1]).rsplit("/", 1)[-1]
        if name not in names:
            continue
        if nbytes is None:
            if key in sizes:
                out.append((name, -sizes.pop(key) // MIB))
        elif key not in sizes:
            sizes[key] = nbytes
            out.append((name, nbytes // MIB))
    return out


ATTENTION_NAMES = {
    "k_repeated", "v_repeated", "q_copy", "raw_scores", "scaled", "masked_scores", "upcast", "probs_fp32", "probs",
    "context", "context_t", "grad_out", "dprobs", "dv", "dprobs32", "softmax_tmp", "dsoft", "dscores", "dscaled", "dq", "dk",
}  # fmt: skip


GELU_NAMES = {
    "half_x", "cube", "scaled_cube", "inner", "tanh_in", "tanh_out", "one_plus_tanh", "result", "grad_out", "grad_half_x",
    "grad_one_plus", "grad_tanh_in", "grad_inner", "grad_cube", "x_squared", "x_squared_3", "grad_pow", "grad_sum",
    "grad_half_in", "grad_in", "up",
}  # fmt: skip
# (up: fc1's output, the chain's saved input x, freed at pow's backward)

# The trace of Phi-2's layer 1 activation (step 2), MiB: forward 0.5 x, x^3, 0.044715 x^3, x^3
# freed, the sum, its multiple, tanh, 1 + tanh, the product; backward after the incoming
# gradient the product's two gradients (the incoming one and the saved factors freed), tanh's,
# the multiple's, then 0.044715's and pow's three, four frees, the sum of x's gradients, 0.5 x's,
# the last sum.
GELU_TRACED_FORWARD = [20, 20, 20, -20, 20, -20, 20, -20, 20, -20, 20, 20]
GELU_TRACED_BACKWARD = [20, 20, -20, -20, -20, 20, -20, -20, 20, -20, 20, 20, 20, 20, -20, -20, -20, -20, 20, -20, -20, 20, -20, 20, -20, -20]


@pytest.fixture(scope="module")
def replayed():
    with pytest.MonkeyPatch.context() as mp:
        yield _replayed(mp, ATTENTION, ATTENTION_NAMES)


@pytest.fixture(scope="module")
def gelu():
    with pytest.MonkeyPatch.context() as mp:
        yield _replayed(mp, GELU, GELU_NAMES)


def test_the_first_forward_allocates_as_the_trace(replayed):
    start = next(i for i, (n, b) in enumerate(replayed) if n == "k_repeated")
    forward = replayed[start : start + 19]
    assert [n for n, _ in forward[:16]] == [
        "k_repeated", "v_repeated", "q_copy", "raw_scores", "q_copy", "scaled", "raw_scores", "masked_scores",
        "scaled", "upcast", "probs_fp32", "upcast", "probs", "masked_scores", "context", "context_t",
    ]  # fmt: skip
    sizes = [b for _, b in forward]
    # the trace frees the unsaved softmax output when the cast is made and the masked scores
    # after it; the replay frees what a checkpointing unit's first forward keeps not at the
    # layer's end: the same blocks up to there, and then the same sizes
    assert sizes[:14] == TRACED_FORWARD[:13] + [-1792]
    assert sizes[14:17] == TRACED_FORWARD[15:18]


def test_the_backward_allocates_as_the_trace(replayed):
    start = next(i for i, (n, b) in enumerate(replayed) if n == "dprobs")
    grad_out = replayed[start - 1]
    assert grad_out == ("grad_out", 28)  # dO, [4, 14, 4096, 64]
    backward = [(n, b) for n, b in replayed[start:] if n not in ("dv", "dq", "dk")][:13]
    assert [b for _, b in backward] == TRACED_BACKWARD[1:]
    assert [n for n, _ in backward] == [
        "dprobs", "probs", "dprobs32", "dprobs", "softmax_tmp", "dsoft", "softmax_tmp", "dprobs32", "probs_fp32",
        "dscores", "dsoft", "dscaled", "dscores",
    ]  # fmt: skip


def test_the_tanh_gelu_allocates_as_the_trace(gelu):
    start = next(i for i, (n, b) in enumerate(gelu) if n == "half_x")
    assert [b for _, b in gelu[start : start + 12]] == GELU_TRACED_FORWARD
    assert [n for n, b in gelu[start : start + 12] if b > 0] == [
        "half_x", "cube", "scaled_cube", "inner", "tanh_in", "tanh_out", "one_plus_tanh", "result",
    ]  # fmt: skip
    start = next(i for i, (n, b) in enumerate(gelu) if n == "grad_half_x")
    # the incoming gradient comes first (fc2's input gradient in the trace, this layer's
    # grad_out in the replay), then the same 26 blocks
    assert gelu[start - 1] == ("grad_out", 20)
    backward = gelu[start : start + 26]
    assert [b for _, b in backward] == GELU_TRACED_BACKWARD
