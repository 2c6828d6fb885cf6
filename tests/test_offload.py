"""DeepSpeed ZeRO-1/2 with the optimizer offloaded to the CPU (zero_optimization.offload_optimizer
device "cpu"): what stays on the GPU, pinned to deepspeed/runtime/zero/stage_1_and_2.py
(DeepSpeedZeroOptimizer): the 16-bit weights (bit16_groups_flat), the reduce buckets,
`temp_grad_buffer_for_gpu_offload` (the largest parameter's numel, 16-bit) and, while a
parameter's gradient is copied out, the float64 of its norm (set_norm_for_param_grad_in_gpu).
No gradient partition, fp32 master, Adam state or optimizer temporary is on the GPU.
LLaVA-1.5-7B: its largest trainable tensors are embed_tokens and lm_head, 32064 x 4096."""

import pytest

from compiler import launch
from compiler.api import estimate
from compiler.errors import MemspecError

FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"
LARGEST = 32064 * 4096  # 131_334_144 elements
ZERO2 = {"zero": 2, "reduce_bucket_size": "auto", "overlap_comm": True, "contiguous_gradients": True}


def _est(**ds):
    return estimate(FINETUNE, deepspeed={**ZERO2, **ds})


def test_nothing_of_the_optimizer_stays_on_the_gpu():
    on, off = _est(), _est(offload_optimizer="cpu")
    for module in ("projector", "language"):
        assert off.estimate.resident[module]["gradients"] == 0
        assert off.estimate.resident[module]["optimizer_states"] == 0
        # the 16-bit weights stay, unsharded under ZeRO-2
        assert off.estimate.resident[module]["parameters"] == on.estimate.resident[module]["parameters"]
    step = {p: t for ph, p, t in off.estimate.timeline if ph == "optimizer"}["optimizer.step"]
    assert step < off.allocated  # no foreach temporaries, no fp32 gradient copy: the step is no peak


def test_the_staging_buffer_is_the_largest_parameter_in_bf16():
    off = _est(offload_optimizer="cpu")
    at_peak = off.estimate.peak.breakdown["deepspeed"]["gradients"]
    buckets = 2 * 4096 * 4096 * 2  # reduce_bucket_size "auto" = hidden^2, two with overlap_comm, bf16
    staging = LARGEST * 2  # temp_grad_buffer_for_gpu_offload: 262_668_288 B
    assert at_peak == buckets + staging == 67_108_864 + 262_668_288


def test_the_norm_in_float64_sits_on_the_backward():
    base = estimate(FINETUNE, deepspeed=ZERO2)
    off = _est(offload_optimizer="cpu")
    b_base = {p: t for ph, p, t in base.estimate.timeline if ph == "backward"}
    b_off = {p: t for ph, p, t in off.estimate.timeline if ph == "backward"}
    # at the loss's backward no gradient exists yet in either; the same activations; the
    # offload drops ZeRO-2's optimizer partition (fp32 master + exp_avg + exp_avg_sq, 1/8 each)
    # and adds the staging buffer (bf16) and the float64 norm copy of the largest parameter
    states = sum(m["optimizer_states"] for m in base.estimate.resident.values())
    assert states == sum(-(-n // 8) for n in _state_bytes(base))
    assert b_off["language.loss"] - b_base["language.loss"] == LARGEST * 2 + LARGEST * 8 - states


def _state_bytes(report):
    """Each layer's optimizer states (12 bytes per trainable parameter), as ZeRO divides them."""
    return [n.cost.optimizer_states for root in report.nodes for n in root.walk() if n.cost.optimizer_states]


def test_json_config_reads_the_offload(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}}')
    assert launch.read_deepspeed(str(path)).overrides["deepspeed"] == {"zero": 2, "offload_optimizer": "cpu"}


def test_offload_without_zero_1_or_2_is_an_error():
    with pytest.raises(MemspecError) as err:
        estimate(FINETUNE, deepspeed={"zero": 3, "offload_optimizer": "cpu"})
    assert "E311" in err.value.render() and "offload_optimizer cpu is modelled for ZeRO stage 1 and 2, not 3" in err.value.render()


def test_the_documented_config_gives_the_experiment_setup():
    # docs/from-your-launch-script.md: the finetune experiment with tests/fixtures/deepspeed/zero2_offload.json
    reading = launch.read_deepspeed("tests/fixtures/deepspeed/zero2_offload.json")
    assert reading.overrides["deepspeed"] == {**ZERO2, "offload_optimizer": "cpu"}
    via_file = estimate(FINETUNE, deepspeed=reading.overrides["deepspeed"])
    assert via_file.allocated == _est(offload_optimizer="cpu").allocated
