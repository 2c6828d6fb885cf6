"""DeepSeek-V2 (deepseek_v2) and the DeepSeek-V3 architecture (deepseek_v3, Moonlight-16B-A3B): the checked-in specs are what `memspec import` writes, their
parameter counts are what transformers builds from the same config.json (meta device), the
layer table's attention and MoE terms, and peft's handling of the MLP names, which the LoRA
records avoid (specs/matrices/deepseek-v2-lite-lora.yaml)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent

# (fixture, checked-in spec, parameters): the arithmetic is in tests/test_import.py
MODELS = [
    ("DeepSeek-V2-Lite", "specs/deepseek_v2/deepseek-v2-lite.yaml", 15_706_484_224),
    ("DeepSeek-V2", "specs/deepseek_v2/deepseek-v2.yaml", 235_741_434_880),
    ("Moonlight-16B-A3B", "specs/deepseek_v3/moonlight-16b-a3b.yaml", 15_960_108_544),
]
LITE = str(ROOT / "specs/deepseek_v2/deepseek-v2-lite.yaml")
ATTENTION = ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]


@pytest.mark.parametrize("fixture, spec, parameters", MODELS)
def test_the_checked_in_spec_is_what_import_writes(fixture, spec, parameters):
    written = api.load_spec(ROOT / spec)
    imported = importer.import_spec(str(hf.FIXTURES / fixture)).spec
    assert hf.modules(written) == hf.modules(imported)
    assert sum(m.parameters for m in written.modules) == parameters


def _meta_model(config: dict):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    built = AutoConfig.for_model(**config)
    with torch.device("meta"):
        return MODEL_FOR_CAUSAL_LM_MAPPING[type(built)]._from_config(built)


@pytest.mark.parametrize(
    "config, parameters", [(hf.DEEPSEEK_V2_LITE, 15_706_484_224), (hf.DEEPSEEK_V2, 235_741_434_880), (hf.MOONLIGHT_16B_A3B, 15_960_108_544)]
)
def test_parameters_are_what_transformers_builds(config, parameters):
    model = _meta_model(config)
    assert sum(p.numel() for p in model.parameters()) == parameters


def test_attention_and_moe_terms():
    """DeepSeek-V2-Lite with LoRA on the attention, sdpa, batch 2, seq 1024 (2048 tokens): the
    kernel saves q and k of 192 per head, v and the output of 128, the k_nope half of kv_b_proj's
    output (v's storage), and the complex rotary table once; the router saves the weight's fp32
    copy, the probabilities and the indices; the experts are grouped_experts with fp32 routing."""
    est = api.estimate(LITE, micro_batch=2, seq_len=1024, attention="sdpa", trainable=[], lora={"r": 16, "alpha": 32, "target_modules": ATTENTION})
    rows = {r.path: r for r in est.rows}
    t = 2048
    q = t * 16 * 192 * 2
    v = t * 16 * 128 * 2
    lse = 2 * 16 * 1024 * 4
    # cuDNN attention on the default H100 (value heads narrower than the query's): its output is
    # laid out like q, which torch.cat made contiguous, so o_proj reads a copy
    assert rows["language.moe_layers[0:26].self_attn.core_cudnn"].activations == 2 * q + 2 * v + lse + 2 * 8  # + philox seed, offset
    assert rows["language.moe_layers[0:26].self_attn.o_proj.lora_a"].activations == v  # the copy, [b, s, heads * 128]
    # an A100 (sm80) runs the memory-efficient kernel, whose output is laid out [b, s, heads, v]:
    # o_proj's adapter saves the kernel's own output, charged with the kernel
    a100 = {
        r.path: r
        for r in api.estimate(
            LITE, micro_batch=2, seq_len=1024, attention="sdpa", trainable=[], lora={"r": 16, "alpha": 32, "target_modules": ATTENTION}, gpu="a100-80gb"
        ).rows
    }
    assert a100["language.moe_layers[0:26].self_attn.core"].activations == 2 * q + 2 * v + lse + 2 * 8
    assert a100["language.moe_layers[0:26].self_attn.o_proj.lora_a"].activations is None
    assert rows["language.dense_layers[0].self_attn.expand"].activations == 1024 * 64 * 4 + t * 16 * 128 * 2  # freqs_cis + k_nope
    assert rows["language.moe_layers[0:26].self_attn.expand"].activations == t * 16 * 128 * 2  # freqs_cis charged once
    assert rows["language.moe_layers[0:26].self_attn.kv_a_layernorm"].activations == t * 512 * 4 + t * 4  # x32 and rstd
    assert rows["language.moe_layers[0:26].moe.gate"].activations == 64 * 2048 * 4 + t * 64 * 4 + t * 6 * 8
    pairs = t * 6
    experts = rows["language.moe_layers[0:26].moe.experts"]
    # perm, token_idx, inv_perm, fp32 routing weights, offsets, gate_up, act, expert_out
    assert experts.activations == 3 * pairs * 8 + pairs * 4 + 64 * 4 + pairs * 1408 * 2 * 3 + pairs * 2048 * 2
    # eager: q, k, a contiguous copy of v, fp32 and bf16 probabilities; kv_b_proj's output dies
    est = api.estimate(LITE, micro_batch=2, seq_len=1024, attention="eager", trainable=[], lora={"r": 16, "alpha": 32, "target_modules": ATTENTION})
    rows = {r.path: r for r in est.rows}
    assert rows["language.moe_layers[0:26].self_attn.core"].activations == 2 * q + v + 2 * 16 * 1024 * 1024 * (4 + 2)
    assert rows["language.moe_layers[0:26].self_attn.expand"].activations is None  # "-": freqs_cis, charged by layer 0


def test_group_limited_routing_saves_the_group_mask():
    """DeepSeek-V2 (group_limited_greedy over 8 groups of 20 experts): masked_fill saves one bool
    [tokens, 160] mask per layer beside the greedy router's tensors."""
    est = api.estimate(str(ROOT / "specs/deepseek_v2/deepseek-v2.yaml"), micro_batch=1, seq_len=1024, attention="sdpa")
    rows = {r.path: r for r in est.rows}
    t = 1024
    # trained: the input's fp32 copy, the weight's, the probabilities, the mask, the indices
    assert rows["language.moe_layers[0:59].moe.gate"].activations == t * 5120 * 4 + 160 * 5120 * 4 + t * 160 * 4 + t * 160 + t * 6 * 8


def test_lora_rows_are_the_attention_projections_the_harness_adapts():
    """The estimate's LoRA rows for the attention targets are the linears the measuring harness
    hands to peft, by Hugging Face's child names."""
    from compiler.measure.harness import lora_targets

    model = _meta_model(hf.DEEPSEEK_V2_LITE)
    lora = {"modules": ["language"], "target_modules": ATTENTION}
    peft_names = {re.sub(r"^model\.layers\.\d+\.", "", n) for n in lora_targets(model, lora, {"language": [model]})}
    est = api.estimate(LITE, micro_batch=1, seq_len=128, trainable=[], lora={"r": 8, "target_modules": ATTENTION})
    adapted = {re.sub(r"^language\.(dense_layers|moe_layers)\[[\d:]+\]\.", "", r.path) for r in est.rows if r.type == "lora_linear"}
    assert adapted == peft_names == {f"self_attn.{name}" for name in ATTENTION}


def test_peft_moves_mlp_targets_to_the_stacked_experts():
    """Why the LoRA records adapt the attention only: for deepseek_v2, peft turns targets named
    gate_proj, up_proj or down_proj into target_parameters on the stacked routed experts
    (ParamWrapper), leaving the dense MLP and the shared experts unadapted. Not modelled; if peft
    stops doing it, the MLP targets can be measured and this test says so."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoConfig, DeepseekV2ForCausalLM

    config = {
        **hf.DEEPSEEK_V2_LITE,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 128,
    }
    with torch.device("meta"):
        model = DeepseekV2ForCausalLM._from_config(AutoConfig.for_model(**config))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "gate_proj", "up_proj", "down_proj"]))
    names = {n for n, _ in wrapped.named_modules()}
    assert any(n.endswith("mlp.experts.base_layer") for n in names)
    assert not any(n.endswith("shared_experts.gate_proj.lora_A") for n in names)
    assert not any(n.endswith("layers.0.mlp.gate_proj.lora_A") for n in names)
    assert any(n.endswith("self_attn.q_proj.lora_A") for n in names)


@pytest.mark.parametrize("targets", ["all-linear", ["gate_proj"], ["down_proj", "q_proj"]])
def test_lora_on_mlp_names_is_refused(targets):
    """The MLP names peft would move to the stacked experts are refused with E334; the attention
    projections are not."""
    from compiler.errors import MemspecError

    with pytest.raises(MemspecError) as exc:
        api.estimate(LITE, micro_batch=1, seq_len=128, trainable=[], lora={"r": 8, "target_modules": targets})
    assert [d.code for d in exc.value.diagnostics] == ["E334"]
    assert "to the stacked routed experts" in exc.value.render()
    assert api.estimate(LITE, micro_batch=1, seq_len=128, trainable=[], lora={"r": 8, "target_modules": ATTENTION}).allocated > 0


def test_deepseek_v3_sigmoid_routing_terms():
    """Moonlight-16B-A3B (deepseek_v3), LoRA on the attention, sdpa, batch 2, seq 1024: the router
    saves the sigmoid scores in place of softmax's, the gather's indices, the renormalisation's
    divisor and clone, and keeps its correction bias as a buffer; the rotary saves cos and sin
    [1, s, 64] in bf16 once."""
    spec = str(ROOT / "specs/deepseek_v3/moonlight-16b-a3b.yaml")
    est = api.estimate(spec, micro_batch=2, seq_len=1024, attention="sdpa", trainable=[], lora={"r": 16, "alpha": 32, "target_modules": ATTENTION})
    rows = {r.path: r for r in est.rows}
    t = 2048
    gate = rows["language.moe_layers[0:26].moe.gate"]
    assert gate.activations == 64 * 2048 * 4 + t * 64 * 4 + t * 6 * 8 + t * 4 + t * 6 * 4
    assert gate.buffers == 64 * 4
    assert rows["language.dense_layers[0].self_attn.expand"].activations == 2 * 1024 * 64 * 2 + t * 16 * 128 * 2
    inputs = importer.import_spec(str(hf.FIXTURES / "Moonlight-16B-A3B")).data["modules"]["language"]["inputs"]
    assert (inputs["sigmoid"], inputs["norm_topk"], inputs["real_rope"], inputs["vocab"]) == (True, True, True, 163840)
