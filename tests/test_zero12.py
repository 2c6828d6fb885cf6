"""DeepSpeed ZeRO-1/2 as its engine allocates per GPU: worked examples with the arithmetic.

Source (read, not run: DeepSpeed needs a GPU): deepspeed/runtime/zero/stage_1_and_2.py,
DeepSpeedZeroOptimizer (deepspeedai/DeepSpeed at 02aa38c3): copy_grads_in_partition,
reduce_independent_p_g_buckets_and_remove_grads, allreduce_bucket, setup_buckets,
_release_ipg_buffers, step; runtime/utils.py, all_gather_into_tensor_dp_groups.

LLaVA-1.5-7B finetune (specs/experiments/llava-1.5-7b-finetune.yaml), ZeRO-2, dp 8, bf16
mixed, AdamW foreach, one parameter group, HF "auto" reduce_bucket_size 4096^2 = 16_777_216,
overlap_comm (two ipg buffers).
"""

import pytest

from compiler.api import estimate, load_inputs, run
from compiler.pipeline.walks.deepspeed import DEEPSPEED
from compiler.pipeline.walks.optimizer_step import stepped_tensors
from compiler.pipeline.walks.zero12 import ZERO12_GRADS, _Zero12Bucket, zero12_grads_in_partition, zero12_partition_sizes, zero12_step_temporaries

FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"
TRAINABLE = 6_759_919_616  # projector 20_979_712 + language 6_738_939_904
PART = 8


def _ds(**ds):
    return estimate(FINETUNE, dp=PART, deepspeed={"reduce_bucket_size": "auto", "contiguous_gradients": True, **ds})


@pytest.fixture(scope="module")
def zero2():
    spec, setup = load_inputs(FINETUNE, {"dp": PART, "zero": 2})
    return run(spec, setup, table=False)


def _tensors(report):
    return stepped_tensors(report.nodes, report.setup)


def test_partition_is_the_padded_group_over_dp(zero2):
    # one group: 6_759_919_616 is a multiple of 2 x 8, so no padding: / 8
    assert zero12_partition_sizes(zero2.setup, _tensors(zero2)) == [TRAINABLE // PART] == [844_989_952]


def test_grads_in_partition_holds_whole_parameters(zero2):
    # rank 1's range [844_989_952, 1_689_979_904) cuts a 45_088_768-element MLP weight at each end
    # (starting at 826_580_992 and at 1_681_203_200): copy_grads_in_partition sizes the buffer
    # with their whole numel: 1_681_203_200 + 45_088_768 - 826_580_992
    elements = zero12_grads_in_partition(zero2.setup, _tensors(zero2))
    assert elements == 1_681_203_200 + 45_088_768 - 826_580_992 == 899_710_976
    assert elements == 844_989_952 + (844_989_952 - 826_580_992) + (1_726_291_968 - 1_689_979_904)


def test_the_ipg_buffers_do_not_reach_the_step():
    # _release_ipg_buffers frees them at the epilogue: one buffer or two (overlap_comm), the same step
    def step(r):
        return r.estimate.timeline[-1]

    one, two = _ds(zero=2, overlap_comm=False), _ds(zero=2, overlap_comm=True)
    assert step(one)[:2] == step(two)[:2] == ("optimizer", "optimizer.step")
    assert step(one)[2] == step(two)[2]

    # while backward reduces, the second buffer is there: 16_777_216 x 2
    def last(r):
        return [t for ph, p, t in r.estimate.timeline if p == "deepspeed.reduce_ipg_grads"][0]

    assert last(two) - last(one) == 16_777_216 * 2


def test_peak_breakdown_rows(zero2):
    # at the peak (the loss's backward, before any reduction) the partition is not there yet
    rows = zero2.estimate.peak.breakdown
    assert ZERO12_GRADS not in rows
    assert rows[DEEPSPEED]["gradients"] == 2 * 16_777_216 * 2


def test_step_temporaries(zero2):
    # beside grads_in_partition, the largest is flatten(averaged_gradients) (844_989_952 x 2) with
    # its .to(fp32) (x 4); the norm's .double() of lm_head (131_334_144 x 8 + 295 norms x 512) and
    # the overflow check (131_334_144 x (4 + 1 + 1 + 1 + 4)) are smaller. The only group then
    # steps after grads_in_partition is freed: its fp32 gradient (x 4) + foreach AdamW's sqrt (x 4)
    assert zero12_step_temporaries(zero2.setup, _tensors(zero2)) == {"with_partition": 844_989_952 * 6, "after_partition": 844_989_952 * 8}
    assert 844_989_952 * 8 - 899_710_976 * 2 < 844_989_952 * 6


def test_the_step_point_is_the_flatten(zero2):
    # the ipg buffers are gone by the step whatever their size: a bucket of 10^12 elements
    # (2 x 2 TB of buffers in backward) leaves the step's total as it is
    step = zero2.estimate.timeline[-1]
    assert step[:2] == ("optimizer", "optimizer.step")
    later = _ds(zero=2, overlap_comm=True, reduce_bucket_size=10**12)  # one bucket: reduced at the epilogue only
    assert later.estimate.timeline[-1][2] - step[2] == 0  # the bucket size does not reach the step


def test_bucket_reduction_and_extra_large_gradient(zero2):
    b = _Zero12Bucket(zero2.setup)
    # lm_head's 32064 x 4096 = 131_334_144 elements exceed the bucket: kept whole, not copied
    assert b.join(131_334_144) is True
    # the norm's 4096-element weight triggers the reduction: flatten of lm_head's slices
    # (131_334_144 x 2) + the waiting norm gradient (4096 x 2); lm_head's gradient is freed
    assert b.flush(4096) == (131_334_144 * 2 + 4096 * 2, 131_334_144 * 2)
    assert b.flush(0) == (0, 0)  # an empty bucket allocates nothing


def test_communication_data_type_copies_the_bucket():
    b = _Zero12Bucket(_ds(zero=2, communication_data_type="fp32").setup)
    b.join(4096 * 11008)
    # an MLP weight, 4096 x 11008 = 45_088_768 elements, exceeds the 16_777_216 bucket: kept whole;
    # flatten (x 2) + .to(fp32) (x 4) + the waiting 4096 x 4096 q_proj gradient (x 2), then the MLP gradient freed
    assert b.flush(4096 * 4096) == (45_088_768 * 2 + 45_088_768 * 4 + 16_777_216 * 2, 45_088_768 * 2)


def test_zero1_without_overlap_reduces_after_backward():
    report = _ds(zero=1, overlap_comm=False)
    est = report.estimate
    at = [t for ph, p, t in est.timeline if p == "deepspeed.reduce_gradients"]
    assert len(at) == 1
    # every whole 16-bit gradient is alive when reduce_gradients starts; the point adds the
    # partition (899_710_976 x 2) and the largest bucket copy (lm_head 131_334_144 x 2)
    last_backward = [t for ph, p, t in est.timeline if ph == "backward" and p != "deepspeed.reduce_gradients"][-1]
    assert at[0] == last_backward + 899_710_976 * 2 + 131_334_144 * 2
    assert est.not_modelled[0].startswith("a layer's 16-bit gradient waiting")


def test_zero1_steps_with_the_partition_as_zero2():
    # ZeRO-1 (either way) and ZeRO-2 reach the step holding grads_in_partition, not
    # 6_759_919_616 x 2 whole gradients: the epilogue frees every .grad
    def step(r):
        return r.estimate.timeline[-1][2]

    assert step(_ds(zero=1, overlap_comm=True)) == step(_ds(zero=1, overlap_comm=False)) == step(_ds(zero=2, overlap_comm=True))


def test_zero1_keeps_too_large_gradients_until_the_epilogue():
    # ZeRO-1's reduce_ipg_grads clears no gradient: every gradient over the 16_777_216 bucket
    # (embed_tokens and lm_head 131_334_144, 96 MLP weights 45_088_768) stays whole through
    # backward; ZeRO-2 clears each at its reduction. At the epilogue's reduction (of embed_tokens,
    # the last gradient, whole under both) the difference is lm_head's and the MLP weights'
    def last(r):
        return [t for ph, p, t in r.estimate.timeline if p == "deepspeed.reduce_ipg_grads"][0]

    large = 131_334_144 * 2 + 96 * 45_088_768 * 2
    assert last(_ds(zero=1, overlap_comm=True)) - last(_ds(zero=2, overlap_comm=True)) == large == 8_919_711_744


def test_two_groups_step_the_first_beside_the_partition():
    # two groups (decay and no decay, alternate tensors): the first group's fp32 gradient and
    # AdamW's sqrt (x 8) run beside grads_in_partition, the last group's after it is freed
    report = _ds(zero=2)
    two = [t if i % 2 else type(t)(t.elements, t.shape, t.module, 1) for i, t in enumerate(_tensors(report))]
    sizes = zero12_partition_sizes(report.setup, two)
    assert len(sizes) == 2 and sum(sizes) >= TRAINABLE // PART
    phases = zero12_step_temporaries(report.setup, two)
    assert phases == {"with_partition": max(sizes[0] * 8, sizes[1] * 6), "after_partition": sizes[1] * 8}
