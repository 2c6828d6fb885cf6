"""PyTorch FSDP2 (fully_shard): the units, the sharded bytes of rank 0 and the buffers of a step,
with the arithmetic beside each number; the measured records check the whole walk."""

import pytest

from compiler.api import estimate
from compiler.cli import main
from compiler.errors import MemspecError
from compiler.pipeline.walks.fsdp import FSDP_GATHER, FSDP_REDUCE, _FsdpPlan

QWEN = "specs/qwen2/qwen2.5-0.5b.yaml"
LLAVA_FSDP = "specs/experiments/llava-1.5-7b-finetune-fsdp2.yaml"
QWEN_SETUP = {"micro_batch": 4, "seq_len": 1024, "images_per_sample": 0, "gradient_checkpointing": ["language"]}
# One Qwen2.5-0.5B decoder layer: q 896*896 + 896, k and v 896*128 + 128 each, o 896*896,
# gate/up/down 3 * 896 * 4864, two RMSNorms 2 * 896.
QWEN_LAYER = 896 * 896 + 896 + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
ROUND = 512


def _up(n):
    return -(-n // ROUND) * ROUND


def _plan(path, **overrides):
    r = estimate(path, **overrides)
    return r, _FsdpPlan(r.nodes, r.setup)


def test_a_decoder_layer_unit_at_dp8():
    assert QWEN_LAYER == 14_912_384
    _, plan = _plan(QWEN, **QWEN_SETUP, dp=8, fsdp={})
    assert len(plan.order) == 24  # one unit per Qwen2DecoderLayer, then the root
    unit = plan.units["language.layers[3]"]
    # every dim 0 (896, 128, 4864) divides by 8: no padding
    assert unit.flat == _up(QWEN_LAYER * 2) == 29_825_024  # the all-gather output, bf16 (traced: 29_825_024)
    assert unit.inp == _up(QWEN_LAYER * 2 // 8) == 3_728_384  # the bf16 copy-in of the fp32 shards (traced: 3_728_384)
    assert unit.rs_in == _up(QWEN_LAYER * 4) == 59_649_536  # reduce-scatter input, fp32
    assert unit.rs_out == _up(QWEN_LAYER * 4 // 8) == 7_456_256  # the flat sharded gradient, fp32
    assert unit.cast == 0  # reduce_dtype fp32 is the shards' dtype
    # the unsharded parameters: one allocation per tensor, each rounded to 512 B
    tensors = [896 * 896, 896, 896 * 128, 128, 896 * 128, 128, 896 * 896, 896 * 4864, 896 * 4864, 896 * 4864, 896, 896]
    assert sum(tensors) == QWEN_LAYER
    assert unit.gathered == sum(_up(t * 2) for t in tensors) == 29_826_048


def test_root_unit_holds_what_no_layer_holds():
    _, plan = _plan(QWEN, **QWEN_SETUP, dp=8, fsdp={})
    # the tied 151936 x 896 embedding (the lm_head counts it) and the final norm's 896
    root_elements = 151936 * 896 + 896
    assert plan.root.flat == _up(root_elements * 2) == 272_271_360  # traced: 272_271_360
    assert 24 * QWEN_LAYER + root_elements == 494_032_768  # the checkpoint's count


def test_rank0_resident_bytes_at_dp2():
    r = estimate(QWEN, **QWEN_SETUP, dp=2, fsdp={})
    shard = r.estimate.resident["language"]
    # fp32 shards of 494_032_768 parameters on 2 ranks (every dim 0 even), 290 tensors each
    # rounded to 512 B; the trace of qwen2-fsdp_2.5-0.5b_b4_s1024_dp2-fsdp_gc-on counts 988_096_512
    weights = 988_096_512
    assert 494_032_768 * 4 // 2 == 988_065_536 <= weights
    # + rotary inv_freq and original_inv_freq (512 B each) + input_ids and labels [4, 1024] int64
    assert shard["parameters"] == weights + 2 * 512 + 2 * 4 * 1024 * 8
    # AdamW's exp_avg and exp_avg_sq: zeros_like each fp32 shard
    assert shard["optimizer_states"] == 2 * weights
    # the gradients: one flat fp32 reduce-scatter output per unit
    assert shard["gradients"] == 24 * _up(QWEN_LAYER * 4 // 2) + _up((151936 * 896 + 896) * 4 // 2)


def test_the_replay_makes_foreach_adamws_sqrt_copies_shard_by_shard():
    """foreach AdamW's `_foreach_sqrt(exp_avg_sqs)` makes one tensor per shard: the replay's
    step allocates each its own block, all before any is freed, rather than one block of
    their sum (the observed transient, which the allocated figure keeps)."""
    from compiler.pipeline.replay import recording_replays

    r, plan = _plan(QWEN, **QWEN_SETUP, dp=2, fsdp={})
    copies = plan.foreach_copies(r.nodes, r.setup)
    # every dim 0 even at dp 2: each fp32 shard is half its tensor, rounded to 512 B; 24 layers
    # of 12 tensors, the tied table and the final norm (the weights' 988_096_512 B above)
    assert len(copies) == 24 * 12 + 2 and sum(copies) == 988_096_512
    # in the walk's order: layer 0's input norm (896 / 2 fp32 elements) first, the tied table
    # last at lm_head, where the walk counts it
    assert copies[0] == _up(896 // 2 * 4) == 2048 and copies[-1] == _up(151936 * 896 // 2 * 4) == 272_269_312
    assert plan.step_temporaries(r.nodes, r.setup) == sum(copies)
    with recording_replays() as replays:
        estimate(QWEN, **QWEN_SETUP, dp=2, fsdp={})
    events = replays[0].events
    starts = replays[0].step_starts  # the steady step is step 2's
    stepped = [(k, n) for k, n in events[starts[1] : starts[2] if len(starts) > 2 else None] if k[0] == "step"]
    assert [n for _, n in stepped[: len(copies)]] == copies  # made together, in order
    assert stepped[len(copies) :] == [(k, None) for k, _ in stepped[: len(copies)]]  # then freed
    fused = dict(QWEN_SETUP, optimizer={"type": "adamw", "impl": "fused"})
    r2, plan2 = _plan(QWEN, **fused, dp=2, fsdp={})
    assert plan2.foreach_copies(r2.nodes, r2.setup) is None  # fused AdamW steps in place


def test_padding_of_dim0_that_does_not_divide():
    # CLIP's position embedding has 577 rows: FSDP2 gives rank 0 ceil(577 / 2) = 289 of them
    r, plan = _plan(LLAVA_FSDP, dp=2)
    node = next(n for root in r.nodes for n in root.walk() if n.inst.path == "vision.embeddings")
    assert plan.tensors(node, r.setup) == [1024 // 2, 289 * 1024]  # class_embedding [1024], position_embedding [577, 1024]
    # without the rows the shard would be 577 * 1024 / 2 = 295_424 elements: 512 short
    assert 289 * 1024 - 577 * 1024 // 2 == 512


def test_reshard_after_forward_false_keeps_every_layer_gathered():
    on = estimate(QWEN, **QWEN_SETUP, dp=8, fsdp={})
    off = estimate(QWEN, **QWEN_SETUP, dp=8, fsdp={"reshard_after_forward": False})
    plan = _FsdpPlan(on.nodes, on.setup)
    at_loss = {p: t for ph, p, t in on.estimate.timeline if ph == "forward"}["language.loss"]
    at_loss_off = {p: t for ph, p, t in off.estimate.timeline if ph == "forward"}["language.loss"]
    # at the loss, 24 layers' unsharded weights are still allocated
    assert at_loss_off - at_loss == sum(u.gathered for u in plan.unit_list())
    # the sharded states do not change
    assert on.estimate.resident == off.estimate.resident


def test_breakdown_shows_the_buffers_and_sums_to_the_total():
    r = estimate(QWEN, micro_batch=1, seq_len=256, images_per_sample=0, dp=8, fsdp={"reshard_after_forward": False})
    plan = _FsdpPlan(r.nodes, r.setup)
    peak = r.estimate.peak
    assert (peak.phase, peak.path) == ("backward", "language.loss")
    assert sum(sum(c.values()) for c in peak.breakdown.values()) == peak.total
    # at the loss's backward every unit is still gathered: 24 layers and the root, bf16
    gathered = sum(u.gathered for u in plan.unit_list()) + plan.root.gathered
    assert peak.breakdown[FSDP_GATHER]["parameters"] == gathered == 988_096_512
    assert FSDP_REDUCE not in peak.breakdown or not any(peak.breakdown[FSDP_REDUCE].values())


def test_bf16_reduce_dtype_adds_the_cast():
    r = estimate(QWEN, **QWEN_SETUP, dp=8, fsdp={"reduce_dtype": "bf16"})
    unit = _FsdpPlan(r.nodes, r.setup).units["language.layers[0]"]
    assert unit.rs_in == _up(QWEN_LAYER * 2)  # bf16 reduce-scatter input
    assert unit.cast == _up(QWEN_LAYER * 2 // 8)  # its bf16 output, cast to the fp32 gradient


def test_fsdp_and_zero_exclude_each_other(capsys):
    assert main(["estimate", QWEN, "--micro-batch", "1", "--seq-len", "256", "--fsdp", "--dp", "8", "--zero", "2"]) == 2
    assert "E310 --fsdp: FSDP and DeepSpeed ZeRO stage 2 both shard the model" in capsys.readouterr().err


def test_experiment_with_both_is_an_error_in_the_file(tmp_path):
    exp = tmp_path / "x.yaml"
    exp.write_text(
        f"experiment: x\nmodel: {__import__('pathlib').Path(QWEN).resolve()}\nmicro_batch: 1\nseq_len: 256\n"
        "images_per_sample: 0\nparallel: {dp: 8, zero: 3, fsdp: {}}\n"
    )
    with pytest.raises(MemspecError) as err:
        estimate(str(exp))
    assert "E310 $.parallel: fsdp and zero 3 both shard the model" in err.value.render()


def test_cli_flags_and_json(capsys):
    assert (
        main(
            [
                "estimate",
                QWEN,
                "--micro-batch",
                "4",
                "--seq-len",
                "1024",
                "--images-per-sample",
                "0",
                "--dp",
                "8",
                "--fsdp-reshard-after-forward",
                "false",
                "--format",
                "json",
            ]
        )
        == 0
    )
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["parallel"] == {"dp": 8, "zero": 0, "fsdp": {"reshard_after_forward": False, "reduce_dtype": "fp32"}}
