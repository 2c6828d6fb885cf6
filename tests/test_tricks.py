"""Training-setup tricks: the fused linear cross-entropy loss, packed batches and activation
offloading, each through the layer table, the timeline and the setup's errors.

Numbers are Qwen2.5-0.5B's (hidden 896, vocab 151936, 24 layers, 14 / 2 heads of 64, tied
embeddings), bf16 mixed precision with AdamW, micro-batch 4.
"""

from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.errors import MemspecError
from compiler.library.formula import FUNCTIONS

ROOT = Path(__file__).resolve().parent.parent
QWEN = ROOT / "specs" / "qwen2" / "qwen2.5-0.5b.yaml"
HIDDEN, VOCAB = 896, 151936
BASE = {"micro_batch": 4, "seq_len": 4096, "images_per_sample": 0, "attention": "sdpa"}


def _run(**overrides):
    return estimate(QWEN, **{**BASE, **overrides})


def _rows(report) -> dict:
    return {r.path: r for r in report.rows}


def _event(report, phase: str, path: str) -> int:
    return next(total for p, where, total in report.estimate.timeline if p == phase and where == path)


def test_next_pow2_is_tritons_next_power_of_2():
    next_pow2 = FUNCTIONS["next_pow2"]
    assert [next_pow2(n) for n in (0, 1, 2, 3, 97, 128, 129)] == [1, 1, 2, 4, 128, 128, 256]


def test_fused_loss_replaces_head_and_loss_rows():
    plain, fused = _rows(_run()), _rows(_run(loss="fused_linear_cross_entropy"))
    assert {"language.lm_head", "language.loss"} <= plain.keys() and "language.lm_head_loss" not in plain
    assert "language.lm_head_loss" in fused and not {"language.lm_head", "language.loss"} & fused.keys()
    row = fused["language.lm_head_loss"]
    # the head's weight moves into the fused row unchanged: 151936 * 896 * 2 bytes
    assert row.parameters == plain["language.lm_head"].parameters == VOCAB * HIDDEN * 2 == 272_269_312
    # saved: grad_input 16384 * 896 * 2 + grad_weight 272_269_312 + the fp32 loss and its seed gradient 2 * 4
    assert row.activations == 16384 * HIDDEN * 2 + VOCAB * HIDDEN * 2 + 8 == 301_629_448
    # chunk next_pow2(cdiv(16384, cdiv(151936, 896) = 170)) = 128: logits 128 * 151936 * 2,
    # padded labels 4 * 4097 * 8, shifted labels 16384 * 8, loss_1d 16384 * 4, mask 16384
    assert row.transient_forward == 128 * VOCAB * 2 + 4 * 4097 * 8 + 16384 * 8 + 16384 * 4 + 16384 == 39_239_712


def test_fused_loss_gradient_is_counted_once():
    plain, fused = _run(), _run(loss="fused_linear_cross_entropy")
    assert fused.estimate.resident["language"]["gradients"] == plain.estimate.resident["language"]["gradients"]
    # In backward, the saved grad_weight becomes the .grad: the fused row's backward event is its
    # forward event less the forward transient (39_239_712) and the final norm's output, which the
    # model held until the forward ended (16384 * 896 * 2), plus torch.tensor(1.0) (4 B); no
    # second 272_269_312 B appears.
    forward = _event(fused, "forward", "language.lm_head_loss")
    backward = _event(fused, "backward", "language.lm_head_loss")
    assert backward == forward - 39_239_712 - 16384 * HIDDEN * 2 + 4


def test_fused_loss_moves_the_peak_out_of_the_loss():
    plain, fused = _run(), _run(loss="fused_linear_cross_entropy")
    assert plain.estimate.peak.path == "language.loss"
    assert fused.estimate.peak.path.startswith("language.layers[")
    # the unfused loss alone holds fp32 logits 16384 * 151936 * 4 = 9_957_081_088 B
    assert plain.allocated - fused.allocated > 16384 * VOCAB * 4


def test_packing_is_one_row_with_a_block_diagonal_mask():
    packed = _run(micro_batch=4, seq_len=1024, packing=True)
    rows = _rows(packed)
    core = rows["language.layers[0:24].self_attn.core"]
    assert core.dims.startswith("b=1 s=4096")
    # sdpa with the packed mask runs the memory-efficient kernel: q, repeated k and v, out
    # 4 * 4096 * 896 * 2 + the additive mask 4096^2 * 2 + lse 14 * 4096 * 4 (4096 a multiple
    # of 32) + philox seed and offset 2 * 8
    assert core.activations == 4 * 4096 * 896 * 2 + 4096 * 4096 * 2 + 14 * 4096 * 4 + 16 == 63_143_952
    # the model holds the bool mask [1, 1, 4096, 4096] for the whole forward
    assert rows["language"].transient_forward == 4096 * 4096
    # the batch's position_ids [1, 4096] int64 join input_ids and labels
    assert rows["language"].buffers == 3 * 4096 * 8


def test_packing_with_flash_needs_no_mask():
    rows = _rows(_run(micro_batch=4, seq_len=1024, packing=True, attention="flash_attention_2"))
    assert rows["language"].transient_forward == 0
    # flash saves q, k, v (2 KV heads), out and lse [1, 14, 4096] fp32, + seed 16 + offset 8
    q, kv = 4096 * 896 * 2, 4096 * 128 * 2
    assert rows["language.layers[0:24].self_attn.core"].activations == 2 * q + 2 * kv + 14 * 4096 * 4 + 24


def test_offloading_keeps_nothing_saved_through_the_forward():
    kept, offloaded = _run(), _run(activation_offloading=True)
    assert sum(kept.estimate.activations_end_of_forward.values()) > 20 * 2**30
    # only what the training loop holds: the fp32 loss and backward()'s seed gradient, 512 B each
    assert sum(offloaded.estimate.activations_end_of_forward.values()) == 2 * 512
    assert offloaded.allocated < kept.allocated
    # the layer table is the same: offloading changes lifetimes, not what each layer saves
    assert [(r.path, r.activations) for r in offloaded.rows] == [(r.path, r.activations) for r in kept.rows]


@pytest.mark.parametrize(
    "overrides, code",
    [
        ({"activation_offloading": True, "gradient_checkpointing": ["language"]}, "E315"),
    ],
)
def test_setup_conflicts_are_errors(overrides, code):
    with pytest.raises(Exception) as info:
        _run(**overrides)
    assert [d.code for d in info.value.diagnostics] == [code]


def test_fused_loss_needs_a_causal_lm_head(tmp_path):
    spec = tmp_path / "tower.yaml"
    spec.write_text(
        "model: tower\nmodules:\n  vision:\n    type: clip_vision_tower\n"
        "    inputs: {hidden: 1024, intermediate: 4096, n_layers: 24, n_heads: 16, image_size: 336, patch: 14, channels: 3, feature_layer: -2}\n"
        "    context: {batch: micro_batch * images_per_sample, seq: (image_size // patch) ** 2 + 1}\n"
        "    parameters: 303_507_456\n"
    )
    with pytest.raises(MemspecError) as info:
        estimate(spec, micro_batch=1, seq_len=577, loss="fused_linear_cross_entropy")
    (d,) = info.value.diagnostics
    assert d.code == "E317" and d.path == "--loss"


@pytest.mark.parametrize("key", ["packing", "activation_offloading"])
def test_packing_and_offloading_need_a_llama_style_model(key):
    # Gemma's formulas hold neither the packed mask nor an offloaded forward's frames
    with pytest.raises(Exception) as info:
        estimate(ROOT / "specs" / "gemma3" / "gemma-3-1b-pt.yaml", micro_batch=1, seq_len=1024, images_per_sample=0, **{key: True})
    assert [(d.code, d.path) for d in info.value.diagnostics] == [("E316", "--" + key.replace("_", "-"))]


QWEN3 = ROOT / "specs" / "qwen3" / "qwen3-8b.yaml"
MP = {"micro_batch": 1, "seq_len": 4096, "images_per_sample": 0, "attention": "flash_attention_2"}


def test_tensor_parallel_splits_the_parallel_regions_only():
    one, eight = _rows(estimate(QWEN3, **MP)), _rows(estimate(QWEN3, **MP, tp=8))
    core = "language.layers[0:36].self_attn.core"
    # q, k, v, out, lse split by 8 (32 / 8 heads, 8 / 8 KV heads); the philox seed and offset (24 B) do not
    assert eight[core].activations - 24 == (one[core].activations - 24) // 8
    # q_proj is column-parallel: 4096 x 4096 / 8 weights; the norms stay whole
    assert eight["language.layers[0:36].self_attn.q_proj"].parameters == 4096 * 512 * 2
    assert eight["language.layers[0:36].input_layernorm"].activations == one["language.layers[0:36].input_layernorm"].activations
    # vocab-parallel: Megatron pads 151936 to a multiple of 128 * 8 = 152_576, 19_072 rows per rank
    assert eight["language.embed_tokens"].parameters == 19_072 * 4096 * 2
    assert eight["language.lm_head"].dims.endswith("d_out=19072")


def test_sequence_parallel_splits_the_norms_too():
    tp, sp = _rows(estimate(QWEN3, **MP, tp=8)), _rows(estimate(QWEN3, **MP, tp=8, sp=True))
    norm = "language.layers[0:36].input_layernorm"
    assert sp[norm].activations == tp[norm].activations // 8  # x32, rstd, normed at 4096 / 8 positions
    q = "language.layers[0:36].self_attn.q_proj"
    assert sp[q].activations == tp[q].activations // 8 == 4096 * 4096 * 2 // 8  # the kept shard
    # the all-gathered input is alive while q_proj runs: its y 4096 * 512 * 2 + x 4096 * 4096 * 2
    assert sp[q].transient_forward == 4096 * 512 * 2 + 4096 * 4096 * 2


def test_pipeline_first_stage_holds_pp_micro_batches():
    report = estimate(QWEN3, **MP, pp=4)
    rows = _rows(report)
    assert rows["language.layers[0:9]"].count == 9  # 36 / 4 layers on the first stage
    assert not {"language.norm", "language.lm_head", "language.loss"} & rows.keys()
    one_microbatch = sum(report.estimate.activations_end_of_forward.values())
    # 1F1B: 3 other micro-batches' saved activations beside this one's
    assert report.estimate.peak.breakdown["pipeline"]["activations"] == 3 * one_microbatch


@pytest.mark.parametrize(
    "spec, overrides, code, flag",
    [
        (QWEN3, {"sp": True}, "E318", "--sp"),
        (QWEN3, {"pp": 5}, "E319", "--pp"),  # 36 layers
        (ROOT / "specs" / "llava" / "llava-1.5-7b.yaml", {"tp": 2, "images_per_sample": 1, "seq_len": 2048}, "E318", "--tp"),
        # the refusals cover what is not modelled with model parallelism: experts, FSDP2 (--fsdp
        # alone: an empty block), bitsandbytes layers, DoRA
        (ROOT / "specs" / "mixtral" / "mixtral-8x7b-v0.1.yaml", {"tp": 2}, "E318", "--tp"),
        (QWEN3, {"tp": 2, "dp": 2, "fsdp": {}}, "E318", "--tp"),
        (QWEN3, {"tp": 2, "quantization": {"bits": 4, "modules": ["language"]}, "trainable": []}, "E318", "--tp"),
        (QWEN3, {"pp": 2, "lora": {"r": 16, "modules": ["language"], "use_dora": True}}, "E318", "--pp"),
    ],
)
def test_model_parallel_errors(spec, overrides, code, flag):
    with pytest.raises(Exception) as info:
        estimate(spec, **{**MP, **overrides})
    assert {(d.code, d.path) for d in info.value.diagnostics} == {(code, flag)}
