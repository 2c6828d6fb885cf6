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
    resident = 128 * 4 + 64 * 4 + 64 * 8 + 2 * WORKSPACE  # weights 512 + 256, AdamW states of b 512, workspaces
    saved_b = 512  # b's input 6 * 16 * 4 = 384 B, rounded up to the allocator's 512 B
    assert [t for _, _, t in report.estimate.timeline] == [
        resident + 6 * 16 * 4,  # forward a: frozen, nothing upstream: saves nothing; its output 384 B
        resident + saved_b + 6 * 4 * 4,  # forward b: saves its input; output 96 B
        resident + saved_b + 64 * 4 + (384 + 96),  # backward b: dW 256 B appears; dX + dY 480 B
        resident + 64 * 4,  # backward a: no gradient flows; b's input freed
        resident + 64 * 4 + 64 * 4,  # step: foreach sqrt(exp_avg_sq) copy, 64 * 4 B
    ]
    assert report.estimate.peak.phase == "backward" and report.estimate.peak.path == "b"
    assert report.allocated == 2528 + 2 * WORKSPACE


def test_first_step_has_no_optimizer_states_before_step(report):
    first = report.estimate.first_step
    assert (first.phase, first.path, first.total) == ("backward", "b", 2528 - 64 * 8 + 2 * WORKSPACE)


def test_first_forward_holds_one_workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(SPEC))
    # Without gradients nothing runs backward-only work: the first step's forward is its peak.
    r = estimate("spec.yaml", micro_batch=2, seq_len=3, trainable=[], precision="fp32")
    assert (r.estimate.first_step.phase, r.estimate.first_step.total) == ("forward", 128 * 4 + 64 * 4 + 6 * 16 * 4 + WORKSPACE)


def test_seed_sum_is_the_plain_sum_of_four_factors(report):
    # parameters 768 + gradients 256 + optimizer states 512 + activations at the end of forward 512
    assert report.estimate.seed_sum == 768 + 256 + 512 + 512


def test_breakdown_sums_to_the_peak(report):
    point = report.estimate.peak
    assert sum(sum(c.values()) for c in point.breakdown.values()) == point.total


def test_zero_shards_states_gradients_and_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(textwrap.dedent(SPEC))
    base = dict(micro_batch=2, seq_len=3, trainable=["b"], precision="fp32", dp=4)
    r1 = estimate("spec.yaml", zero=1, **base).estimate.resident
    r3 = estimate("spec.yaml", zero=3, **base).estimate.resident
    assert r1["b"] == {"parameters": 256, "optimizer_states": 512 // 4, "gradients": 256}
    assert r3["b"] == {"parameters": 256 // 4, "optimizer_states": 512 // 4, "gradients": 256 // 4}


def test_reserved_is_at_least_allocated_and_device_adds_the_context(report):
    assert report.reserved >= report.allocated
    assert report.device == report.reserved + report.device_constants.cuda_context
