"""Formulas' allocation orders (`allocations:`) in the estimate's replay of the caching
allocator, checked against the traced step of the same record, tensor by tensor.

Eager attention (formulas/attention_core.yaml): Qwen2.5-0.5B, eager, micro-batch 4, seq 4096,
checkpointed (14 heads of 64, 2 key-value heads). One layer's scores [4, 14, 4096, 4096] are
939,524,096 elements: 1,792 MiB in bf16, 3,584 MiB in fp32; q and the repeated k and v
[4, 14, 4096, 64] are 28 MiB each.

The tanh GELU written in Python (formulas/gelu_new.yaml): Phi-2, micro-batch 1, seq 1024, its
MLP 10,240 wide: each tensor of the chain [1, 1024, 10240] in bf16 is 20 MiB.

BLOOM's eager kernel (formulas/bloom_attention_core.yaml): bloom-560m, micro-batch 4, seq 1024,
checkpointed; the four BLOOM GPU records reserve the GPU's byte in the formulas' order."""

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
# (probs @ v's backward), its fp32 copy, softmax's input gradient (the structured kernel's
# output, made before its body runs) and tmp, tmp freed as the kernel returns, the saved softmax
# output freed, the cast back, `* scaling`'s gradient.
TRACED_BACKWARD = [28, 1792, -1792, 3584, -1792, 3584, 3584, -3584, -3584, -3584, 1792, -3584, 1792, -1792]


def _events(monkeypatch, record: Path) -> list:
    """The (key, bytes) events the estimate's replay of `record` runs, in order."""
    events = played(monkeypatch)
    comparison, why = record_report(record)
    assert why is None
    return list(events)


def _replayed(monkeypatch, record: Path, names: set[str]) -> list[tuple[str, int]]:
    """(name, +MiB allocated / -MiB freed) of every tensor of `names` the estimate's replay of
    `record` makes, in order."""
    return _named(_events(monkeypatch, record), names)


def _named(events: list, names: set[str]) -> list[tuple[str, int]]:
    sizes, out = {}, []
    for key, nbytes in events:
        if not (isinstance(key, tuple) and key and key[0] in ("transient", "output", "tensor")):
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
def attention_events():
    """The replay of ATTENTION, run once for the tests that read it."""
    with pytest.MonkeyPatch.context() as mp:
        events = _events(mp, ATTENTION)
    return events


@pytest.fixture(scope="module")
def replayed(attention_events):
    return _named(attention_events, ATTENTION_NAMES)


@pytest.fixture(scope="module")
def gelu():
    with pytest.MonkeyPatch.context() as mp:
        yield _replayed(mp, GELU, GELU_NAMES)


def test_the_first_forward_allocates_as_the_trace(replayed):
    start = next(i for i, (n, b) in enumerate(replayed) if n == "k_repeated")
    forward = replayed[start : start + len(TRACED_FORWARD)]
    # the softmax output, which the unit's first forward does not keep, dies when the cast is
    # made, before the masked scores: block for block the trace
    assert [n for n, _ in forward] == [
        "k_repeated", "v_repeated", "q_copy", "raw_scores", "q_copy", "scaled", "raw_scores", "masked_scores",
        "scaled", "upcast", "probs_fp32", "upcast", "probs", "probs_fp32", "masked_scores", "context", "context_t",
        "context",
    ]  # fmt: skip
    assert [b for _, b in forward] == TRACED_FORWARD


def test_the_backward_allocates_as_the_trace(replayed):
    start = next(i for i, (n, b) in enumerate(replayed) if n == "dprobs")
    grad_out = replayed[start - 1]
    assert grad_out == ("grad_out", 28)  # dO, [4, 14, 4096, 64]
    backward = [(n, b) for n, b in replayed[start:] if n not in ("dv", "dq", "dk")][:13]
    assert [b for _, b in backward] == TRACED_BACKWARD[1:]
    assert [n for n, _ in backward] == [
        "dprobs", "probs", "dprobs32", "dprobs", "dsoft", "softmax_tmp", "softmax_tmp", "dprobs32", "probs_fp32",
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


def _made_to_freed(events: list, suffix: str) -> list:
    """The events from the first allocation of the tensor whose key ends with `suffix` to its free."""
    start = next(i for i, (k, b) in enumerate(events) if b and isinstance(k, tuple) and len(k) > 1 and str(k[1]).endswith(suffix))
    key = events[start][0]
    end = next(i for i in range(start + 1, len(events)) if events[i] == (key, None))
    return events[start : end + 1]


def test_eager_attention_weights_live_until_the_checkpointing_unit_returns(attention_events):
    # eager_attention_forward returns its probabilities, and the decoder layer holds them in a
    # local (`hidden_states, _ = self.self_attn(...)`) through its MLP: the trace frees layer
    # 1's 1,792 MiB cast at the layer's end, though its first forward keeps nothing
    life = _made_to_freed(attention_events, "layers[1].self_attn.core/probs")
    assert life[0][1] == 1792 * MIB
    names = [str(k[1]) for k, b in life if b and isinstance(k, tuple) and len(k) > 1]
    assert "language.layers[1].post_attention_layernorm/x32" in names
    # the unit's output (the residual add, which the next unit keeps as its input) is made
    # while the layer still holds them, as in the trace (layer 3's 14 MiB output of
    # Qwen2.5-0.5B packed lands beside its held weights, not in their block): the weights go
    # only once the next unit has its input
    assert life[-2] == (("tensor", "language.layers[2]/input"), 28 * MIB)
    assert not any("layers[2]" in n for n in names[:-1])


# Gemma3RMSNorm, traced (layer 1's post_feedforward_layernorm of Gemma-3-1B trained whole, b 4,
# s 1024, hidden 1152, step 1; the blocks of 1 MiB and more): each fp32 tensor 4096 * 1152 * 4 =
# 18 MiB, the result in bf16 9 MiB. Forward: x.float(), pow(2), the mean frees it, x * rstd,
# * (1 + w), type_as, the product freed.
GEMMA_NORM = ROOT / "tests" / "measured" / "gpu" / "gemma3_1b_b4_s1024_sdpa_gc-off.json"
GEMMA_TRACED_FORWARD = [18, 18, -18, 18, 18, 9, -18]
# Backward: grad.float(); * (1 + w)'s two gradients, (1 + w)'s (summed) first; both freed with
# the saved normalised x; x * rstd's two, rstd's first; mean's and pow's four, three freed with
# the saved x32; the two gradients of x32 summed; the cast back.
GEMMA_TRACED_BACKWARD = [18, 18, 18, -18, -18, -18, 18, 18, -18, -18, 18, 18, 18, 18, -18, -18, -18, -18, 18, -18, -18, 9, -18]
NORM_NAMES = {
    "x32", "squares", "normed32", "normed", "product", "result", "g32", "dw_temp", "dnormed", "drstd_temp", "dx_a",
    "dsquares", "pow_a", "pow_b", "dx_b", "dx32", "dx",
}  # fmt: skip


def test_the_gemma_norm_allocates_as_the_trace(monkeypatch):
    replayed = _replayed(monkeypatch, GEMMA_NORM, NORM_NAMES)
    start = next(i for i, (n, b) in enumerate(replayed) if n == "x32" and b == 18)
    assert [b for _, b in replayed[start : start + 7]] == GEMMA_TRACED_FORWARD
    assert [n for n, _ in replayed[start : start + 7]] == ["x32", "squares", "squares", "normed32", "product", "result", "product"]
    start = next(i for i, (n, b) in enumerate(replayed) if n == "g32")
    assert [b for _, b in replayed[start : start + 23]] == GEMMA_TRACED_BACKWARD


# LlamaRMSNorm's backward, traced (Qwen2.5-0.5B packed, trained whole, b 4, s 2048, hidden 896,
# checkpointed, step 1, after the recomputation): 16-bit tensors 14 MiB, fp32 ones 28 MiB. The
# weight's multiply (x's gradient first, then the weight's, freed with the saved cast), the
# cast's backward, x * rstd's (rstd's first), mean's and pow's, the sum and the cast back. The
# trace frees the incoming gradient after the weight's multiply: the replay frees it elsewhere.
RMS_NORM = ROOT / "tests" / "measured" / "gpu" / "qwen2-packing_2.5-0.5b_b4_s2048_eager_gc-on.json"
RMS_TRACED_BACKWARD = [14, 14, -14, -14, 28, -14, 28, 28, -28, -28, 28, 28, 28, 28, -28, -28, -28, -28, 28, -28, -28, 14, -28]


def test_the_rms_norm_backward_allocates_as_the_trace(monkeypatch):
    replayed = _replayed(monkeypatch, RMS_NORM, NORM_NAMES)
    start = next(i for i, (n, b) in enumerate(replayed) if n == "dnormed")
    assert [b for _, b in replayed[start : start + 23]] == RMS_TRACED_BACKWARD


# Phi's partial rotary, traced (Phi-2 LoRA, eager, b 4, s 2048, checkpointed, layer 0, step 1;
# 32 heads of 80, the first 32 dims rotated): each head's rotated slice [4, 32, 2048, 32] in bf16
# is 16 MiB, rotate_half's -x2 half of it, the whole q or k [4, 32, 2048, 80] 40 MiB. q * cos,
# -x2, rotate_half's cat, -x2 freed, * sin, the cat freed, the sum, both products freed; k the
# same; then each torch.cat of a rotated slice with its pass-through rest.
PHI_LORA = ROOT / "tests" / "measured" / "gpu" / "phi-lora_2_b4_s2048_eager_gc-on.json"
ROTARY_TRACED_FORWARD = [16, 8, 16, -8, 16, -16, 16, -16, -16] * 2 + [40, 40]
ROTARY_NAMES = {f"{t}_{n}" for t in "qk" for n in ("cos", "neg", "half", "sin", "rot", "whole")}


def test_the_partial_rotary_allocates_as_the_trace(monkeypatch):
    replayed = _replayed(monkeypatch, PHI_LORA, ROTARY_NAMES)
    start = next(i for i, (n, b) in enumerate(replayed) if n == "q_cos")
    forward = replayed[start : start + len(ROTARY_TRACED_FORWARD)]
    assert [b for _, b in forward] == ROTARY_TRACED_FORWARD
    assert [n for n, b in forward if b > 0] == [
        "q_cos", "q_neg", "q_half", "q_sin", "q_rot", "k_cos", "k_neg", "k_half", "k_sin", "k_rot", "q_whole", "k_whole",
    ]  # fmt: skip
    # the slices and the whole q and k go at the rotary's end, the four blocks the trace's
    # attention still holds (its locals) and its core's q and k
    assert sorted(b for _, b in replayed[start + len(ROTARY_TRACED_FORWARD) : start + len(ROTARY_TRACED_FORWARD) + 4]) == [-40, -40, -16, -16]


def test_a_checkpointing_units_shared_input_is_one_tensor(attention_events):
    # Qwen2.5-0.5B's layer 1 in its checkpointing unit's first forward: q_proj, k_proj and
    # v_proj each save the normed input ([4, 4096, 896] bf16, 28 MiB) and keep none of it; it
    # is one tensor from the first of them until the last has run (three moments, probes of
    # the projections' outputs: q 28 MiB, k and v 4 MiB each), not one per projection
    events = attention_events
    life = _made_to_freed(events, "layers[1]/attn_in")
    assert life[0][1] == 28 * MIB
    assert [b // MIB for k, b in life[1:-1]] == [28, 4, 4]
    made = [i for i, (k, b) in enumerate(events[: events.index(life[-1])]) if k == life[0][0] and b]
    assert len(made) == 1


def test_a_gated_mlps_activation_lives_while_up_proj_runs(attention_events):
    # LlamaMLP: down_proj(act_fn(gate_proj(x)) * up_proj(x)) evaluates act before up_proj, and
    # its output waits for the product (swiglu_mlp's act: `output: act_out`). Layer 1 of
    # Qwen2.5-0.5B in its checkpointing unit's first forward, each [4, 4096, 4864] bf16 tensor
    # 152 MiB: act_out is made as act returns, alive through up_proj's moment (a probe of its
    # output) and the product's, freed once the product, its last reader, has run
    life = _made_to_freed(attention_events, "layers[1].mlp/act_out")
    assert life[0] == (("tensor", "language.layers[1].mlp/act_out"), 152 * MIB)
    assert life[1] == (("probe",), 152 * MIB)  # up_proj's output
    # the product's moment: up (its other input) and its result, on top of act_out
    assert [b // MIB for k, b in life[2:-1] if b] == [152, 152]
    assert sum(1 for k, b in life if k == life[0][0] and b) == 1


# BLOOM's eager kernel (formulas/bloom_attention_core.yaml), traced: bloom-560m trained whole,
# b 4, s 1024, checkpointed (16 heads of 64), block 1's first forward and a block's backward, MiB:
# scores [64, 1024, 1024] 128 in bf16, 256 in fp32; q, k, v [64, 1024, 64] 8 each, the fused
# output [4, 1024, 3072] 24. The trace's q, k and v copies (+8 +8 +8) are one block of 24 in the
# replay (the saved qkv), and so are their frees.
BLOOM = ROOT / "tests" / "measured" / "gpu" / "bloom_560m_b4_s1024_eager_gc-on.json"
BLOOM_TRACED_FORWARD = [
    ("fused", 24), ("qkv", 24), ("raw_scores", 128), ("masked_scores", 128), ("upcast", 256), ("probs_fp32", 256),
    ("upcast", -256), ("probs", 128), ("probs_fp32", -256), ("context", 8), ("merged", 8), ("context", -8),
]  # fmt: skip
# Backward: dense's input gradient, its [b * heads, s, d] copy, dv and dprobs (probs freed by
# bmm's backward), the cast's fp32 gradient, softmax's input gradient and tmp, the cast back,
# baddbmm's two gradients each scaled by alpha, then the fused gradient from three
# select_backward and two sums. (The trace frees v's copy with probs, q's and k's after dk.)
BLOOM_TRACED_BACKWARD = [
    ("grad_out", 8), ("grad_heads", 8), ("grad_out", -8), ("dv", 8), ("dprobs", 128), ("probs", -128), ("grad_heads", -8),
    ("dprobs32", 256), ("dprobs", -128), ("dsoft", 256), ("softmax_tmp", 256), ("softmax_tmp", -256), ("probs_fp32", -256),
    ("dprobs32", -256), ("dscores", 128), ("dsoft", -256), ("dq_raw", 8), ("dq", 8), ("dq_raw", -8), ("dk_raw", 8), ("dk", 8),
    ("dk_raw", -8), ("qkv", -24), ("dscores", -128), ("dfused_v", 24), ("dv", -8), ("dfused_k", 24), ("dk", -8),
    ("dfused_kv", 24), ("dfused_v", -24), ("dfused_k", -24), ("dfused_q", 24), ("dq", -8), ("dfused", 24),
    ("dfused_kv", -24), ("dfused_q", -24),
]  # fmt: skip


def test_bloom_attention_allocates_as_the_trace(monkeypatch):
    names = {n for n, _ in BLOOM_TRACED_FORWARD + BLOOM_TRACED_BACKWARD}
    replayed = _replayed(monkeypatch, BLOOM, names)
    starts = [i for i, (n, b) in enumerate(replayed) if n == "fused" and b > 0]
    assert replayed[starts[1] : starts[1] + len(BLOOM_TRACED_FORWARD)] == BLOOM_TRACED_FORWARD
    start = next(i for i, (n, b) in enumerate(replayed) if n == "grad_heads") - 1
    assert replayed[start : start + len(BLOOM_TRACED_BACKWARD)] == BLOOM_TRACED_BACKWARD
