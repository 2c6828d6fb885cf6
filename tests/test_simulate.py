"""The step timeline on a two-layer model small enough to walk by hand.

Model: a = linear 8 -> 16 (frozen), b = linear 16 -> 4 (trainable); fp32, AdamW foreach;
micro-batch 2 x seq 3 = 6 tokens. bytes: param 4, grad 4, optim 8 (exp_avg + exp_avg_sq), act 4.
No --gpu: the catalog's default GPU (H100, sm90) decides the cuBLAS workspaces, 32 MiB +
1 MiB (cuBLASLt) per GEMM thread, two threads (forward and autograd) in a steady-state step.
"""

import textwrap

import pytest

from compiler.api import estimate

WORKSPACE = (32 + 1) * 2**20  # per thread

SPEC = """\
model: two-linears
modules:
  a:
    type: linear
    inputs: {d_in: 8, d_out: 16}
    context: {batch: micro_batch, seq: seq_len}
    parameters: 128
  b:
    type: linear
    inputs: {d_in: 16, d_out: 4}
    context: {batch: micro_batch, seq: seq_len}
    parameters: 64
"""


@pytest.fixture()
def report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(SPEC))
    return estimate("spec.yaml", micro_batch=2, seq_len=3, trainable=["b"], precision="fp32")


def test_timeline_by_hand(report):
    # Every tensor is its own allocation, rounded up to 512 B: a's weight 128 * 4 = 512;
    # b's weight 64 * 4 = 256 -> 512, its exp_avg and exp_avg_sq 256 -> 512 each.
    resident = 512 + 512 + 2 * 512 + 2 * WORKSPACE
    saved_b = 512  # b's input 6 * 16 * 4 = 384 B -> 512
    grad_b = 512  # dW 64 * 4 = 256 B -> 512
    assert [t for _, _, t in report.estimate.timeline] == [
        resident + 6 * 16 * 4,  # forward a: frozen, nothing upstream: saves nothing; its output 384 B
        resident + saved_b + 6 * 4 * 4,  # forward b: saves its input; output 96 B
        resident + saved_b + grad_b + (384 + 96),  # backward b: dW appears; dX + dY 480 B
        resident + grad_b,  # backward a: no gradient flows; b's input freed
        resident + grad_b + 512,  # step: foreach sqrt(exp_avg_sq) copy, 64 * 4 = 256 B -> 512
    ]
    assert report.estimate.peak.phase == "backward" and report.estimate.peak.path == "b"
    assert report.tensors == 3552 + 2 * WORKSPACE
    # max_memory_allocated counts blocks: at backward b the weights (2 x 512), the states
    # (2 x 512), b's input 512, dW 512, and dX (384 B) and dY (96 B) each a 512 B block
    assert report.allocated == 1024 + 1024 + 512 + 512 + 512 + 512 + 2 * WORKSPACE == 4096 + 2 * WORKSPACE


def test_first_step_has_no_optimizer_states_before_step(report):
    # Forward and backward of step 1 run without the 1024 B of states (backward b: 2528 B);
    # its step creates them and then holds the same as every step: 3072 B.
    first = report.estimate.first_step
    assert (first.phase, first.total) == ("optimizer", 3072 + 2 * WORKSPACE)


def test_first_forward_holds_one_workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(SPEC))
    # With nothing trainable there is no backward: the forward is the peak, on one GEMM thread.
    r = estimate("spec.yaml", micro_batch=2, seq_len=3, trainable=[], precision="fp32")
    assert (r.estimate.first_step.phase, r.estimate.first_step.total) == ("forward", 512 + 512 + 6 * 16 * 4 + WORKSPACE)


def test_seed_sum_is_the_plain_sum_of_four_factors(report):
    # parameters 1024 + gradients 512 + optimizer states 1024 + activations at the end of forward 512
    assert report.estimate.seed_sum == 1024 + 512 + 1024 + 512


def test_breakdown_sums_to_the_peak(report):
    point = report.estimate.peak
    assert sum(sum(c.values()) for c in point.breakdown.values()) == point.total


def test_zero_shards_states_gradients_and_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(SPEC))
    base = dict(micro_batch=2, seq_len=3, trainable=["b"], precision="fp32", dp=4)
    r1 = estimate("spec.yaml", zero=1, **base).estimate.resident
    r3 = estimate("spec.yaml", zero=3, **base).estimate.resident
    # Unsharded tensors are rounded to 512 B; ZeRO's flat partitions hold total / ranks.
    assert r1["b"] == {"parameters": 512, "optimizer_states": 64 * 8 // 4, "gradients": 512}
    # ZeRO-3 keeps a parameter under stage3_param_persistence_threshold (DeepSpeed's 100_000)
    # whole on every rank beside its partition: 64 x 4 = 256 B, one 512 B block
    assert r3["b"] == {"parameters": 64 * 4 // 4 + 512, "optimizer_states": 64 * 8 // 4, "gradients": 64 * 4 // 4}
    # at threshold 0 it is partitioned like the rest
    r3 = estimate("spec.yaml", deepspeed={"zero": 3, "param_persistence_threshold": 0}, **base).estimate.resident
    assert r3["b"] == {"parameters": 64 * 4 // 4, "optimizer_states": 64 * 8 // 4, "gradients": 64 * 4 // 4}


def test_reserved_is_at_least_allocated_and_device_adds_the_context(report):
    assert report.reserved >= report.allocated
    assert report.device == report.reserved + report.device_constants.cuda_context
