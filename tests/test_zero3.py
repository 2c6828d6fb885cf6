"""DeepSpeed ZeRO-3 as its engine allocates per GPU: worked examples with the arithmetic.

Sources (read, not run: DeepSpeed needs a GPU): deepspeed/runtime/zero/stage3.py and
runtime/comm/coalesced_collectives.py (deepspeedai/DeepSpeed at 007cca6a / 17b3b557),
zero/partitioned_param_coordinator.py (00a31c99), zero/config.py (1b88ac36); the older
stage3.py of microsoft/DeepSpeed at 0003660d for the optimizer step at initialization.

LLaVA-1.5-7B finetune (specs/experiments/llava-1.5-7b-finetune.yaml): ZeRO-3, dp 8, bf16
mixed, HF "auto" sizes from hidden_size 4096: reduce_bucket_size 4096^2 = 16_777_216,
stage3_prefetch_bucket_size int(0.9 x 4096^2) = 15_099_494, stage3_param_persistence_threshold
10 x 4096 = 40_960.
"""

from dataclasses import replace

import pytest

from compiler.api import estimate
from compiler.cli import main
from compiler.pipeline.resolve import DEEPSPEED_STATES_AT_INIT, with_overrides
from compiler.pipeline.walks.optimizer_step import Stepped, stepped_tensors
from compiler.pipeline.walks.zero3 import _IpgBucket, _reuse_kept, zero3_step_temporaries, zero3_sub_groups

FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"
ZERO3 = {
    "zero": 3,
    "reduce_bucket_size": "auto",
    "prefetch_bucket_size": "auto",
    "param_persistence_threshold": "auto",
    "overlap_comm": True,
    "contiguous_gradients": True,
}
TRAINABLE = 20_979_712 + 6_738_939_904  # projector + language
PART = 8


def _z3(**ds):
    return estimate(FINETUNE, deepspeed={**ZERO3, **ds})


@pytest.fixture(scope="module")
def finetune():
    return estimate(FINETUNE)


def _events(report, phase, path):
    return [t for ph, p, t in report.estimate.timeline if ph == phase and p == path]


# ---------------------------------------------------------------- the gradient partition


def test_gradient_partition_is_resident_from_initialization(finetune):
    # stage3.py, _setup_for_real_optimizer: grad_partitions_flat_buffer = torch.zeros of every
    # trainable parameter's partition_numel, in bf16: 6_759_919_616 x 2 / 8
    grads = TRAINABLE * 2 // PART
    assert grads == 1_689_979_904
    # it is there in the first forward already (the first step's peak is at the loss's backward,
    # before any gradient was computed)
    first = finetune.estimate.first_step
    assert first.path == "language.loss"
    assert first.breakdown["language"]["gradients"] + first.breakdown["projector"]["gradients"] == grads


# ---------------------------------------------------------------- reduce-scatter


def test_bucket_of_several_tensors_is_copied_flat_for_the_reduce_scatter():
    # reduce_scatter_coalesced: chunks of ceil(numel / dp) per rank, padded, torch.cat'ed.
    # dp 4, fp32 gradients, bucket 1000 elements: 64 then 128 elements join, then 900 does not fit
    bucket = _IpgBucket(_setup(dp=4, grad=4, limit=1000))
    assert bucket.add(_cost([64 * 4])) == []
    assert bucket.add(_cost([128 * 4])) == []
    # (16 + 32) x 4 ranks = 192 elements x 4 B = 768 -> 1024 B; the waiting 900 x 4 = 3600 -> 4096 B
    assert bucket.add(_cost([900 * 4])) == [1024 + 4096]
    # the epilogue: one tensor of 900 divisible by 4 is reduced in place (no copy, nothing waiting)
    assert bucket.flush(0) == 0


def test_indivisible_tensors_are_padded_chunk_by_chunk():
    # dp 3: 64 -> 3 x 22 = 66 (rank 2 holds 20 + a 2-element torch.empty pad), 128 -> 3 x 43 = 129
    # (rank 2: 42 + 1); 195 x 4 B = 780 -> 1024 B, and two padding blocks of 512 B
    bucket = _IpgBucket(_setup(dp=3, grad=4, limit=1000))
    bucket.add(_cost([64 * 4, 128 * 4]))
    assert bucket.flush(0) == 1024 + 2 * 512


def test_one_tensor_divisible_by_the_ranks_is_reduced_in_place():
    # "if there's only one tensor being reduced and we don't need to pad ... avoid a memory allocation"
    bucket = _IpgBucket(_setup(dp=8, grad=2, limit=16_777_216))
    bucket.add(_cost([4096 * 11008 * 2]))  # down_proj: 45_088_768 elements, over the bucket alone
    assert bucket.flush(0) == 0


def test_llava_bucket_reduction_at_down_proj(finetune):
    # Every Linear of Llama-2-7B holds at least 4096^2 elements, so each bucket holds one tensor
    # (or one 4096-element RMSNorm weight), divisible by 8: no flat copy. At layer 30's
    # down_proj the bucket holding layer 31's input_layernorm is reduced while down_proj's whole
    # bf16 gradient waits: 4096 x 11008 x 2 = 90_177_536 B above the layer's own backward.
    events = _events(finetune, "backward", "language.layers[30].mlp.down_proj")
    recompute, reduction, own = events
    assert reduction - own == 4096 * 11008 * 2 == 90_177_536
    # the epilogue reduces the last bucket (the projector's linear_1 weight, in place)
    assert _events(finetune, "backward", "deepspeed.reduce_scatter")


def test_deepspeeds_default_bucket_copies_whole_layers():
    # reduce_bucket_size 5e8 (DeepSpeed's default, not "auto"): backward fills the bucket with
    # lm_head (32064 x 4096), the final norm (4096), layer 31 (202_383_360 with its norms),
    # layer 30's MLP (3 x 4096 x 11008), post_attention_layernorm (4096) and o_proj (4096^2):
    held = 32064 * 4096 + 4096 + 202_383_360 + 3 * 4096 * 11008 + 4096 + 4096 * 4096
    assert held == 485_769_216
    # v_proj (4096^2) no longer fits under 5e8: the bucket is reduced, torch.cat copying all of
    # it (every tensor divisible by 8: no padding) while v_proj's gradient waits
    big = _z3(reduce_bucket_size=500_000_000)
    recompute, reduction, own = _events(big, "backward", "language.layers[30].self_attn.v_proj")
    assert reduction - own == held * 2 + 4096 * 4096 * 2 == 1_005_092_864
    # and the bucket itself is resident from backward on: 5e8 x 2 B
    assert big.estimate.peak.breakdown["deepspeed"]["gradients"] == 1_000_000_000


def test_communication_data_type_converts_the_bucket(finetune):
    # "communication_data_type": "fp32" under bf16: __avg_scatter_grads converts every gradient
    # of the bucket (g.to(fp32)) and the reduced partitions back (g.to(bf16)). At layer 30's
    # up_proj the bucket holding down_proj (4096 x 11008, one tensor divisible by 8: no flat
    # copy) is reduced: 45_088_768 x 4 = 180_355_072 B converted + 45_088_768 / 8 x 2 =
    # 11_272_192 B back, beside the waiting up_proj gradient
    fp32 = _z3(communication_data_type="fp32")
    label = "language.layers[30].mlp.up_proj"
    assert _events(fp32, "backward", label)[1] - _events(finetune, "backward", label)[1] == 180_355_072 + 11_272_192
    # the regular event (no reduction) is the same
    assert _events(fp32, "backward", label)[2] == _events(finetune, "backward", label)[2]


# ---------------------------------------------------------------- persistence, prefetch, reuse


def test_small_parameters_stay_whole(finetune):
    # under 10 x 4096 = 40_960 elements, each kept whole beside its partition (bf16):
    # language: 65 RMSNorm weights, 65 x 4096 x 2 = 532_480 B; projector: two 4096-element
    # biases, 16_384 B; vision (CLIP ViT-L/14-336): class_embedding 1024, pre/post LayerNorm
    # 2 x 2 x 1024, and per layer 4 attention biases + 2 LayerNorms (8 x 1024) + fc1 bias
    # 4096 + fc2 bias 1024 = 13_312, x 24 layers: 324_608 elements x 2 = 649_216 B
    none = _z3(param_persistence_threshold=0)
    extra = {m: finetune.estimate.resident[m]["parameters"] - none.estimate.resident[m]["parameters"] for m in ("vision", "projector", "language")}
    assert extra == {"vision": (1024 + 4 * 1024 + 24 * 13_312) * 2, "projector": 2 * 4096 * 2, "language": 65 * 4096 * 2}
    assert extra["vision"] == 649_216


def test_max_live_parameters_caps_the_prefetch(finetune):
    # fetch_sub_module prefetches min(max_live - available, prefetch_bucket) elements:
    # 15_099_494 x 2 = 30_198_988 -> 30_199_296 B (512 B blocks) ahead of layer 0's q_proj;
    # with stage3_max_live_parameters 0 nothing is prefetched
    label = "language.layers[0].self_attn.q_proj"
    capped = _z3(max_live_parameters=0)
    assert _events(finetune, "forward", label)[0] - _events(capped, "forward", label)[0] == 30_199_296


def test_reuse_distance_keeps_the_last_layers_gathered(finetune):
    # __params_to_release keeps a layer met again within max_reuse_distance (1e9) elements of
    # later fetches. At the loss's backward lm_head (32064 x 4096, used again right away) and
    # layer 31 (recomputed after lm_head's backward; its norms are persistent) are gathered:
    kept = 32064 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert kept == 333_709_312
    kept_bytes = kept * 2 - kept * 2 // PART  # beside the local eighth, already resident
    assert finetune.estimate.peak.breakdown["zero3-kept"]["parameters"] == kept_bytes == 583_991_296
    assert finetune.allocated - _z3(max_reuse_distance=0).allocated == kept_bytes


def test_reuse_decision_by_hand():
    # fetches: A(10) B(5) A(10) C(1) B(5): A comes back after 5 elements, B after 10 + 1
    trace = [("A", 10), ("B", 5), ("A", 10), ("C", 1), ("B", 5)]
    assert _reuse_kept(trace, 6) == [True, False, False, False, False]
    assert _reuse_kept(trace, 12) == [True, True, False, False, False]
    assert _reuse_kept(trace, 5) == [False, False, False, False, False]  # 5 elements reached: DeepSpeed stops


# ---------------------------------------------------------------- the step


def test_sub_groups_by_hand():
    # partitions at dp 2: 600 -> 300, 500 -> 250, 300 -> 150, 700 -> 350; a sub-group closes at
    # 500 elements or more: [300 + 250 = 550], [150 + 350 = 500]
    setup = _setup(dp=2, grad=2, limit=1, sub_group=500)
    tensors = [Stepped(600, None), Stepped(500, None), Stepped(300, None), Stepped(700, None)]
    assert zero3_sub_groups(setup, tensors) == [550, 500]
    # bf16 mixed, foreach AdamW: flatten (550 x 2 = 1100 -> 1536) + .to(fp32) (550 x 4 = 2200
    # -> 2560) = 4096; the step holds the fp32 gradient (2560) and _foreach_sqrt's copy of
    # exp_avg_sq (2560) = 5120; the norms' .double() of the largest partition 350 x 8 -> 3072
    assert zero3_step_temporaries(setup, tensors) == {"zero3_step": 5120}
    # sub-groups are made per optimizer parameter group (HF Trainer: with and without decay)
    split = [Stepped(600, None), Stepped(500, None, group=1), Stepped(300, None), Stepped(700, None, group=1)]
    assert zero3_sub_groups(setup, split) == [450, 600]  # group 0: 300 + 150; group 1: 250 + 350


def test_one_sub_group_is_the_whole_partition(finetune):
    # 6_759_919_616 / 8 = 844_989_952 elements per rank, under sub_group_size 1e9: one
    # sub-group; its fp32 gradient and foreach AdamW's sqrt copy, 8 B per element
    step = _events(finetune, "optimizer", "optimizer.step")[0]
    small = _z3(sub_group_size=100_000_000)
    step_small = _events(small, "optimizer", "optimizer.step")[0]
    groups = zero3_sub_groups(small.setup, stepped_tensors(small.nodes, small.setup))
    largest = max(groups)
    # a sub-group closes at the first parameter that takes it to 1e8: it ends under 1e8 plus
    # one partition (at most the embedding's, 32064 x 4096 / 8 = 16_416_768)
    assert 100_000_000 <= largest < 100_000_000 + 16_416_768
    assert step - step_small == 8 * (TRAINABLE // PART) - 8 * largest


# ---------------------------------------------------------------- optimizer states timing


def test_first_step_has_the_fp32_master_partition_not_the_states(finetune):
    # DeepSpeed >= 0.14 (PR #5104): the fp32 master partition exists from initialization
    # (_create_fp32_partitions), Adam's exp_avg / exp_avg_sq appear in the first step()
    assert DEEPSPEED_STATES_AT_INIT is False
    first = finetune.estimate.first_step
    master = first.breakdown["language"]["optimizer_states"] + first.breakdown["projector"]["optimizer_states"]
    assert master == 20_979_712 * 4 // PART + 6_738_939_904 * 4 // PART == 3_379_959_808
    steady = finetune.estimate.peak.breakdown
    assert steady["language"]["optimizer_states"] + steady["projector"]["optimizer_states"] == TRAINABLE * 12 // PART


def test_constants_name_the_sizes_and_the_assumption(finetune):
    from compiler.api import constants

    named = {c.name: c.value for c in constants(finetune)}
    assert named["zero_optimization.stage3_param_persistence_threshold"] == 40_960
    assert named["zero_optimization.stage3_prefetch_bucket_size"] == 15_099_494
    assert named["zero_optimization.stage3_max_live_parameters"] == 1_000_000_000
    assert named["zero_optimization.stage3_max_reuse_distance"] == 1_000_000_000
    assert named["zero_optimization.sub_group_size"] == 1_000_000_000
    assert named["optimizer states created"] == "at the first step()"


# ---------------------------------------------------------------- the command line


def test_offload_flags_match_the_experiment_path():
    flags = estimate(FINETUNE, offload_optimizer="cpu", offload_param="cpu")
    block = _z3(offload_optimizer="cpu", offload_param="cpu")
    assert flags.allocated == block.allocated


@pytest.mark.parametrize(
    "argv, code",
    [
        (["--zero", "2", "--offload-optimizer", "nvme"], "E311 --offload-optimizer"),
        (["--zero", "0", "--offload-optimizer", "cpu"], "E311 --offload-optimizer"),
        (["--zero", "2", "--offload-optimizer", "cpu", "--offload-param", "cpu"], "E806 --offload-param"),
        (["--offload-param", "cpu"], "E807 --offload-param"),
    ],
)
def test_offload_flags_are_checked_at_the_flag(argv, code, capsys):
    assert main(["estimate", FINETUNE, *argv]) == 2
    assert code in capsys.readouterr().err


def test_deepspeed_json_sizes_are_read(tmp_path):
    from compiler.inputs import launch

    path = tmp_path / "ds.json"
    path.write_text(
        '{"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": "auto", '
        '"stage3_max_live_parameters": 3e8, "stage3_max_reuse_distance": 0, "sub_group_size": 1e8}}'
    )
    ds = launch.read_deepspeed(str(path)).overrides["deepspeed"]
    assert ds == {"zero": 3, "param_persistence_threshold": "auto", "max_live_parameters": 300_000_000, "max_reuse_distance": 0, "sub_group_size": 100_000_000}
    path.write_text('{"communication_data_type": "FP32", "zero_optimization": {"stage": 3}}')
    assert launch.read_deepspeed(str(path)).overrides["deepspeed"] == {"zero": 3, "communication_data_type": "fp32"}
    path.write_text('{"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}')
    with pytest.raises(Exception) as err:
        launch.read_deepspeed(str(path))
    assert "E801" in err.value.render() and "sub_group_size" in err.value.render()


# ---------------------------------------------------------------- helpers


class _Ds:
    def __init__(self, limit, sub_group):
        self.reduce_bucket, self.sub_group_size = limit, sub_group
        self.comm_bytes = None  # the gradients' dtype


class _Setup:
    def __init__(self, dp, grad, limit, sub_group):
        self.dp, self.deepspeed = dp, _Ds(limit, sub_group)
        self.bytes = {"param": grad, "grad": grad}
        self.master_bytes = 4 if grad == 2 else 0
        self.state_bytes = 4


def _setup(dp, grad, limit, sub_group=1_000_000_000):
    if grad == 2:
        # bf16 mixed, foreach AdamW: the real Setup of the finetune experiment, resized
        base = estimate(FINETUNE).setup
        ds = replace(base.deepspeed, reduce_bucket=limit, sub_group_size=sub_group)
        return with_overrides(base, dp=dp, deepspeed=ds)
    return _Setup(dp, grad, limit, sub_group)


class _cost:
    def __init__(self, tensors):
        self.param_tensors = tuple(tensors)
        self.gradients = sum(tensors)
