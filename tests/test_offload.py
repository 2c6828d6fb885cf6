"""DeepSpeed optimizer and parameter offload: what stays on the GPU.

ZeRO-1/2 with the optimizer offloaded to the CPU (zero_optimization.offload_optimizer device
"cpu"), pinned to deepspeed/runtime/zero/stage_1_and_2.py (DeepSpeedZeroOptimizer): the 16-bit
weights (bit16_groups_flat), the reduce buckets, `temp_grad_buffer_for_gpu_offload` (the
largest parameter's numel, 16-bit) and, while a parameter's gradient is copied out, the float64
of its norm (set_norm_for_param_grad_in_gpu). No gradient partition, fp32 master, Adam state or
optimizer temporary is on the GPU.

ZeRO-3 with offload_optimizer (cpu or nvme) and offload_param (cpu or nvme), pinned to
deepspeed/runtime/zero/stage3.py (DeepSpeedZeroOptimizer_Stage3): the 16-bit partition stays
unless the parameters are offloaded; the gradient partitions and fp32 partitions are made on
the CPU; per reduced parameter a GPU copy of its gradient partition, its float64 chunk and a
0-dim float64 norm kept until the step. NVMe swaps through pinned host buffers: the GPU side
is the CPU offload's. Not measured: DeepSpeed and a GPU are not available here.

LLaVA-1.5-7B: its largest trainable tensors are embed_tokens and lm_head, 32064 x 4096; 295
trainable tensors (projector 2 x (weight, bias); language embed_tokens, 32 x (7 linears + 2
norms), the final norm, lm_head)."""

import pytest

from compiler.inputs import launch
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


def test_offload_without_a_zero_stage_is_an_error():
    with pytest.raises(MemspecError) as err:
        estimate(FINETUNE, deepspeed={"zero": 0, "offload_optimizer": "cpu"})
    assert "E311" in err.value.render() and "ZeRO-0 has no optimizer partition to offload" in err.value.render()


def test_nvme_below_zero_3_is_an_error():
    with pytest.raises(MemspecError) as err:
        estimate(FINETUNE, deepspeed={**ZERO2, "offload_optimizer": "nvme"})
    assert "E311" in err.value.render() and "offload_optimizer nvme is a ZeRO-3 feature, not ZeRO-2" in err.value.render()


def test_parameter_offload_needs_zero_3_and_the_optimizer_offload():
    with pytest.raises(MemspecError) as err:
        estimate(FINETUNE, deepspeed={**ZERO2, "offload_optimizer": "cpu", "offload_param": "cpu"})
    assert "E806" in err.value.render()
    with pytest.raises(MemspecError) as err:
        estimate(FINETUNE, deepspeed={**ZERO3, "offload_param": "cpu"})
    assert "E807" in err.value.render() and "offload_param cpu without offload_optimizer" in err.value.render()


def test_the_documented_config_gives_the_experiment_setup():
    # docs/from-your-launch-script.md: the finetune experiment with tests/fixtures/deepspeed/zero2_offload.json
    reading = launch.read_deepspeed("tests/fixtures/deepspeed/zero2_offload.json")
    assert reading.overrides["deepspeed"] == {**ZERO2, "offload_optimizer": "cpu"}
    via_file = estimate(FINETUNE, deepspeed=reading.overrides["deepspeed"])
    assert via_file.allocated == _est(offload_optimizer="cpu").allocated


# ---------------------------------------------------------------- ZeRO-3 (stage3.py)

ZERO3 = {"zero": 3, "reduce_bucket_size": "auto", "prefetch_bucket_size": "auto", "overlap_comm": True, "contiguous_gradients": True}
PARAMS = {"vision": 303_507_456, "projector": 20_979_712, "language": 6_738_939_904}
TENSORS = 295
GRANULE = 512


def _z3(**ds):
    return estimate(FINETUNE, deepspeed={**ZERO3, **ds})


def _points(report, phase):
    return {p: t for ph, p, t in report.estimate.timeline if ph == phase}


def test_zero3_optimizer_offload_keeps_the_16_bit_partition_only():
    on, off = _z3(), _z3(offload_optimizer="cpu")
    for module in ("projector", "language"):
        assert off.estimate.resident[module]["gradients"] == 0  # grad_partitions_flat_buffer on the CPU
        assert off.estimate.resident[module]["optimizer_states"] == 0  # fp32 partition and Adam states on the CPU
        assert off.estimate.resident[module]["parameters"] == on.estimate.resident[module]["parameters"]
    # the language model's 16-bit partition at dp 8: 6_738_939_904 x 2 / 8, plus its buffers,
    # plus the whole copies of its 65 RMSNorm weights (4096 elements, under
    # stage3_param_persistence_threshold "auto" = 10 x 4096): 65 x 4096 x 2 = 532_480
    assert off.estimate.resident["language"]["parameters"] == 6_738_939_904 * 2 // 8 + 525_312 + 532_480 == 1_685_792_768


def test_zero3_optimizer_offload_at_the_peak():
    """The peak stays at the loss's backward: ZeRO-3's states leave, the offload's transient arrives."""
    on, off = _z3(), _z3(offload_optimizer="cpu")
    assert on.estimate.peak.phase == off.estimate.peak.phase == "backward"
    states = (20_979_712 + 6_738_939_904) * 12 // 8  # fp32 master + exp_avg + exp_avg_sq, 1/8 each
    assert states == 10_139_879_424
    part = -(-32064 * 4096 // 8)  # lm_head's gradient partition: 16_416_768 elements
    copy = part * 2  # grad_buffer.to(device), bf16: 32_833_536 B
    double = part * 8  # _constant_buffered_norm2's .double() (under its 250_000_000 chunk): 131_334_144 B
    norms = TENSORS * GRANULE  # one 0-dim float64 norm per parameter: 151_040 B
    # without offload ZeRO-3's 16-bit gradient partition (grad_partitions_flat_buffer) is on the
    # GPU from initialization; offloaded it is in host memory
    grads = (20_979_712 + 6_738_939_904) * 2 // 8
    assert grads == 1_689_979_904
    assert off.tensors - on.tensors == -states - grads + copy + double + norms == -11_665_540_608
    # 25_068_468_224 before cos and sin were [1, s, 128] (16 x 2048: 15 x 2048 x 128 x 2 x 2 B less)
    assert off.tensors == 25_052_739_584
    assert off.estimate.peak.breakdown["language"]["optimizer_states"] == 0


def test_zero3_offload_step_keeps_only_the_norms_on_the_gpu():
    off = _z3(offload_optimizer="cpu")
    # after backward: the 16-bit partitions, buffers, the IPG bucket (4096^2 bf16) and the workspaces
    resident = sum(sum(v.values()) for v in off.estimate.resident.values())
    step = _points(off, "optimizer")["optimizer.step"]
    bucket = 4096 * 4096 * 2
    workspaces = step - resident - bucket - (TENSORS + 1) * GRANULE
    assert workspaces == 2 * 9_568_256  # two GEMM threads' cuBLAS workspaces on a100-80gb
    # norm_for_param_grads (295 x 512 B) and total_norm_cuda (512 B); the CPU Adam needs nothing more


def test_zero3_parameter_offload_moves_every_partition_off_the_gpu():
    opt, both = _z3(offload_optimizer="cpu"), _z3(offload_optimizer="cpu", offload_param="cpu")
    partitions = sum(PARAMS.values()) * 2 // 8  # 7_063_427_072 x 2 / 8
    assert partitions == 1_765_856_768
    # buffers stay on the GPU; no parameter partition does (param_groups_fp16_flat_cpu_memory)
    # except the whole copies of persistent parameters (under stage3_param_persistence_threshold
    # "auto" = 10 x 4096): the projector's two 4096-element biases, 2 x 4096 x 2 = 16_384 B, and
    # the language model's 65 RMSNorm weights, 65 x 4096 x 2 = 532_480 B
    assert both.estimate.resident["projector"]["parameters"] == 16_384
    assert both.estimate.resident["language"]["parameters"] == 525_312 + 532_480
    # at the loss the difference is the partitions, less the slices of the layers kept gathered
    # for their reuse in backward (stage3_max_reuse_distance 1e9): lm_head (32064 x 4096) and
    # layer 31 (4 x 4096^2 + 3 x 4096 x 11008, its norms persistent) are whole in both; with
    # the partition on the GPU their kept copy lacks the local eighth
    kept = 32064 * 4096 + 4 * 4096 * 4096 + 3 * 4096 * 11008
    assert kept == 333_709_312
    assert opt.estimate.peak.breakdown["zero3-kept"]["parameters"] == kept * 2 - kept * 2 // 8
    assert both.estimate.peak.breakdown["zero3-kept"]["parameters"] == kept * 2
    assert opt.tensors - both.tensors == partitions - kept * 2 // 8 == 1_682_429_440
    # inside a layer the full weights are gathered either way, and with offload_param the
    # all-gather's input is a GPU copy of the host partition: down_proj 4096 x 11008 in bf16
    down = 4096 * 11008 * 2
    # (no layer kept for reuse here, so that the two differ by the gather alone)
    opt, both = (_z3(offload_optimizer="cpu", max_reuse_distance=0), _z3(offload_optimizer="cpu", offload_param="cpu", max_reuse_distance=0))
    f_opt, f_both = _points(opt, "forward"), _points(both, "forward")
    label = "language.layers[31].mlp.down_proj"
    assert f_both[label] - f_opt[label] == -partitions + 2 * (down // 8) == -1_765_856_768 + 22_544_384


def test_nvme_offload_is_the_cpu_offload_on_the_gpu():
    cpu = _z3(offload_optimizer="cpu", offload_param="cpu")
    nvme = _z3(offload_optimizer="nvme", offload_param="nvme")
    assert nvme.allocated == cpu.allocated
    assert nvme.estimate.timeline == cpu.estimate.timeline


def test_zero3_offload_in_the_setup_line_and_json():
    from compiler.pipeline.render import as_data, setup_line

    both = _z3(offload_optimizer="cpu", offload_param="nvme")
    assert "ZeRO-3, optimizer offloaded to cpu, parameters offloaded to nvme" in setup_line(both)
    assert as_data(both)["setup"]["parallel"]["offload_param"] == "nvme"


@pytest.mark.parametrize(
    "fixture, expected",
    [
        ("zero3_offload", {"offload_optimizer": "cpu", "param_persistence_threshold": "auto"}),
        ("zero3_offload_param", {"offload_optimizer": "cpu", "offload_param": "cpu", "param_persistence_threshold": "auto"}),
        ("zero3_nvme", {"offload_optimizer": "nvme", "offload_param": "nvme"}),
    ],
)
def test_zero3_configs_give_the_experiment_setup(fixture, expected):
    reading = launch.read_deepspeed(f"tests/fixtures/deepspeed/{fixture}.json")
    assert reading.overrides["deepspeed"] == {**ZERO3, **expected}
    assert estimate(FINETUNE, deepspeed=reading.overrides["deepspeed"]).allocated == _z3(**expected).allocated


def test_nvme_aio_section_is_host_side():
    notes = launch.read_deepspeed("tests/fixtures/deepspeed/zero3_nvme.json").notes
    assert any("not used (no effect on memory): aio" in n for n in notes)


def test_accelerate_config_reads_zero3_offload():
    reading = launch.read_accelerate("tests/fixtures/accelerate/deepspeed-zero3-offload.yaml")
    assert reading.overrides["deepspeed"] == {"zero": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}


def test_json_parameter_offload_alone_is_refused(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}}')
    with pytest.raises(MemspecError) as err:
        launch.read_deepspeed(str(path))
    assert "E807" in err.value.render()
