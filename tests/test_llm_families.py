"""The decoder-only LLM families beyond Llama's layout (gpt_neox, phi, falcon, bloom, glm, glm4, olmo2, starcoder2, stablelm, granite, cohere, cohere2, opt): each checked-in spec is what `memspec import` writes
from its fixture, its parameter count is the one transformers' model reports for the same
config.json (built on the meta device), peft's all-linear targets are the linear rows the
estimate adapts, and the variants the formulas do not model are refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent

# (fixture, checked-in spec, parameters): the arithmetic is in tests/test_import.py
MODELS = [
    ("pythia-1.4b", "specs/gpt_neox/pythia-1.4b.yaml", 1_414_647_808),
    ("phi-2", "specs/phi/phi-2.yaml", 2_779_683_840),
    ("phi-1_5", "specs/phi/phi-1_5.yaml", 1_418_270_720),
    ("falcon-40b", "specs/falcon/falcon-40b.yaml", 41_303_293_952),
    ("bloom-560m", "specs/bloom/bloom-560m.yaml", 559_214_592),
    ("bloomz-7b1", "specs/bloom/bloomz-7b1.yaml", 7_069_016_064),
    ("glm-4-9b-chat-hf", "specs/glm/glm-4-9b-chat-hf.yaml", 9_399_951_360),
    ("GLM-4-9B-0414", "specs/glm4/glm-4-9b-0414.yaml", 9_400_279_040),
    ("OLMo-2-0425-1B", "specs/olmo2/OLMo-2-0425-1B.yaml", 1_484_916_736),
    ("starcoder2-3b", "specs/starcoder2/starcoder2-3b.yaml", 3_030_371_328),
    ("stablelm-2-1_6b", "specs/stablelm/stablelm-2-1_6b.yaml", 1_644_515_328),
    ("granite-3.0-2b-base", "specs/granite/granite-3.0-2b-base.yaml", 2_533_531_648),
    ("aya-expanse-8b", "specs/cohere/aya-expanse-8b.yaml", 8_028_033_024),
    ("c4ai-command-r7b-12-2024", "specs/cohere2/c4ai-command-r7b-12-2024.yaml", 8_028_033_024),
    ("opt-1.3b", "specs/opt/opt-1.3b.yaml", 1_315_758_080),
    ("opt-6.7b", "specs/opt/opt-6.7b.yaml", 6_658_473_984),
]


@pytest.mark.parametrize("fixture, spec, parameters", MODELS)
def test_the_checked_in_spec_is_what_import_writes(fixture, spec, parameters):
    written = api.load_spec(ROOT / spec)
    imported = importer.import_spec(str(hf.FIXTURES / fixture)).spec
    assert hf.modules(written) == hf.modules(imported)
    assert sum(m.parameters for m in written.modules) == parameters


def _meta_model(fixture: str):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from compiler.measure.families import family_for

    config_path = hf.FIXTURES / fixture / "config.json"
    family = family_for(config_path)
    with torch.device("meta"):
        return family.model_class()._from_config(family.load_config(config_path))


@pytest.mark.parametrize("fixture, spec, parameters", MODELS)
def test_parameters_are_what_transformers_builds(fixture, spec, parameters):
    model = _meta_model(fixture)
    assert sum(p.numel() for p in model.parameters()) == parameters


@pytest.mark.parametrize("fixture, spec, parameters", MODELS)
def test_lora_all_linear_adapts_what_peft_adapts(fixture, spec, parameters):
    """The estimate's LoRA rows are the linears the measuring harness hands to peft (every
    nn.Linear but the output embedding), by Hugging Face's child names."""
    from compiler.measure.harness import lora_targets

    model = _meta_model(fixture)
    lora = {"modules": ["language"], "target_modules": "all-linear"}
    peft_names = {re.sub(r"^(?:[a-z_]+\.)+?(layers|h)\.\d+\.", "", n) for n in lora_targets(model, lora, {"language": [model]})}
    est = api.estimate(str(ROOT / spec), micro_batch=1, seq_len=128, lora={"r": 8})
    adapted = {re.sub(r"^language\.(layers|global_layers|h)\[[\d:]+\]\.", "", r.path) for r in est.rows if r.type == "lora_linear"}
    assert adapted == peft_names
    assert "lm_head" not in adapted


def _import_with(tmp_path: Path, fixture: str, **changes) -> str:
    folder = tmp_path / fixture
    folder.mkdir()
    config = json.loads((hf.FIXTURES / fixture / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))
    for f in (hf.FIXTURES / fixture).glob("*.safetensors"):
        hf.sparse_copy(f, folder / f.name)
    with pytest.raises(MemspecError) as exc:
        importer.import_spec(str(folder))
    return exc.value.render()


@pytest.mark.parametrize(
    "change, words",
    [
        ({"use_parallel_residual": False}, "use_parallel_residual false"),
        ({"hidden_dropout": 0.1}, "dropout"),
        ({"hidden_act": "relu"}, "GELU"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling"),
    ],
)
def test_gpt_neox_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "pythia-1.4b", **change)
    assert "E713" in message and words in message


def test_gpt_neox_layer_terms():
    """Pythia-1.4B, trained, sdpa, batch 1, seq 2048 (x = 2048 * 2048 * 2 = 8 MiB): the fused
    qkv output stays whole (v is a view of it, 3x), the flash output and its contiguous copy
    for dense are two tensors, and the rotary saves cos and sin of 32 of 128 dimensions."""
    est = api.estimate(str(ROOT / "specs/gpt_neox/pythia-1.4b.yaml"), micro_batch=1, seq_len=2048)
    rows = {r.path: r for r in est.rows}
    layer = "language.layers[0:24]"
    x = 2048 * 2048 * 2
    assert rows[f"{layer}.attention.split"].activations == 2 * x
    assert rows[f"{layer}.attention.dense"].activations == x
    # q, k, v and the kernel's output, the fp32 logsumexp [16, 2048] and the philox seed and offset
    assert rows[f"{layer}.attention.core"].activations == 4 * x + 16 * 2048 * 4 + 16 + 8
    assert rows["language.layers[0].attention.rotary"].activations == 2 * 2048 * 32 * 2
    # both LayerNorms read the layer's input: charged once, by the first
    assert rows[f"{layer}.post_attention_layernorm"].activations == 2 * 2048 * 4


@pytest.mark.parametrize(
    "change, words",
    [
        ({"qk_layernorm": True}, "qk_layernorm"),
        ({"hidden_act": "gelu"}, "gelu_new"),
        ({"embd_pdrop": 0.1}, "dropout"),
        ({"num_key_value_heads": 8}, "key-value heads"),
    ],
)
def test_phi_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "phi-2", **change)
    assert "E713" in message and words in message


def test_phi_layer_terms():
    """Phi-2, trained, sdpa, batch 1, seq 2048 (x = 2048 * 2560 * 2 = 10 MiB, f = 4x): one
    LayerNorm whose output q, k, v and fc1 all save (charged once), gelu_new's four saved
    tensors, and resid_dropout's bool masks (p = 0.1) on both branches."""
    est = api.estimate(str(ROOT / "specs/phi/phi-2.yaml"), micro_batch=1, seq_len=2048)
    rows = {r.path: r for r in est.rows}
    layer = "language.layers[0:32]"
    x = 2048 * 2560 * 2
    assert rows[f"{layer}.self_attn.q_proj"].activations == x
    assert rows[f"{layer}.mlp.fc1"].activations is None  # the same normed states, charged by q_proj
    assert rows[f"{layer}.mlp.activation_fn"].activations == 4 * 4 * x
    assert rows[f"{layer}.resid_dropout[0]"].activations == rows[f"{layer}.resid_dropout_mlp[0]"].activations == 2048 * 2560
    # lm_head has a bias: 51200 x 2560 + 51200, bf16
    assert rows["language.lm_head"].parameters == (51200 * 2560 + 51200) * 2
    # Phi-1.5 has no residual dropout
    rows15 = {r.path: r for r in api.estimate(str(ROOT / "specs/phi/phi-1_5.yaml"), micro_batch=1, seq_len=2048).rows}
    assert not any("resid_dropout" in p for p in rows15)


@pytest.mark.parametrize(
    "change, words",
    [
        # Falcon-7B's layout: multi-query attention, one shared LayerNorm
        ({"new_decoder_architecture": False, "multi_query": True, "num_kv_heads": None}, "multi-query"),
        ({"alibi": True}, "ALiBi"),
        ({"num_ln_in_parallel_attn": 1}, "ln_attn and ln_mlp"),
        ({"tie_word_embeddings": False}, "untied"),
    ],
)
def test_falcon_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "falcon-40b", **change)
    assert "E713" in message and words in message


def test_falcon_layer_terms():
    """Falcon-40B, trained, batch 1, seq 1024 (x = 1024 * 8192 * 2 = 16 MiB): k and v are
    copied out to all 128 heads, so the kernel keeps q, k, v at full width; sdpa gets the causal
    mask and runs the memory-efficient kernel, which saves its additive form per layer and
    whose output dense reads as it is; eager saves its probabilities once, in bf16."""
    spec = str(ROOT / "specs/falcon/falcon-40b.yaml")
    layer = "language.h[0:60].self_attention"
    x = 1024 * 8192 * 2
    sdpa = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=1024, attention="sdpa").rows}
    # q, k, v, the output 4x, the logsumexp [128, 1024] fp32, the [1, 1, s, s] bf16 mask, two int64 philox tensors
    assert sdpa[f"{layer}.core"].activations == 4 * x + 128 * 1024 * 4 + 1024 * 1024 * 2 + 8 + 8
    assert sdpa[f"{layer}.dense"].activations is None
    eager = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=1024, attention="eager").rows}
    assert eager[f"{layer}.core"].activations == 3 * x + 128 * 1024 * 1024 * 2
    assert eager[f"{layer}.dense"].activations == x


@pytest.mark.parametrize(
    "change, words",
    [
        ({"apply_residual_connection_post_layernorm": True}, "apply_residual_connection_post_layernorm"),
        ({"slow_but_exact": True, "pretraining_tp": 4}, "slow_but_exact"),
        ({"attention_dropout": 0.1}, "dropout"),
        ({"tie_word_embeddings": False}, "untied"),
    ],
)
def test_bloom_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "bloom-560m", **change)
    assert "E713" in message and words in message


def test_bloom_offers_eager_only():
    """BloomPreTrainedModel declares no sdpa or flash support: transformers refuses them, and so
    does the estimate."""
    spec = str(ROOT / "specs/bloom/bloom-560m.yaml")
    with pytest.raises(MemspecError):
        api.estimate(spec, micro_batch=1, seq_len=1024, attention="sdpa")


def test_bloom_layer_terms():
    """bloom-560m, trained, batch 1, seq 1024 (x = 1024 * 1024 * 2 = 2 MiB): baddbmm and probs @ v
    keep q, k and v (views of the fused output at batch 1), the softmax its fp32 result and
    probs @ v the bf16 cast; GeLUFunction saves its input only."""
    spec = str(ROOT / "specs/bloom/bloom-560m.yaml")
    rows = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=1024).rows}
    layer = "language.h[0:24]"
    x = 1024 * 1024 * 2
    assert rows[f"{layer}.self_attention.core"].activations == 3 * x + 16 * 1024 * 1024 * (4 + 2)
    assert rows[f"{layer}.mlp"].activations == 4 * x
    assert rows[f"{layer}.self_attention.dense"].activations == x


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_act": "gelu"}, "SwiGLU"),
        ({"attention_dropout": 0.1}, "attention dropout"),
    ],
)
def test_olmo2_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "OLMo-2-0425-1B", **change)
    assert "E713" in message and words in message


def test_olmo2_layer_terms():
    """OLMo-2-0425-1B, trained, sdpa, batch 1, seq 2048 (x = 2048 * 2048 * 2 = 8 MiB): q, k and v
    save the layer's input itself (no input norm), every RMSNorm (the q/k norms over the whole
    projection, the two post-norms) saves the fp32 upcast and the fp32 normalised x, and the
    rotary's cos and sin stay fp32."""
    est = api.estimate(str(ROOT / "specs/olmo2/OLMo-2-0425-1B.yaml"), micro_batch=1, seq_len=2048)
    rows = {r.path: r for r in est.rows}
    layer = "language.layers[0:16]"
    x = 2048 * 2048 * 2
    assert rows[f"{layer}.self_attn.q_proj"].activations == x
    norm = 2 * (2 * x) + 2048 * 4  # x32 and the normalised x, fp32, and rstd [2048, 1]
    for name in ("self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm", "post_feedforward_layernorm"):
        assert rows[f"{layer}.{name}"].activations == norm
    assert rows["language.layers[0].self_attn.rotary"].activations == 2 * 2048 * 128 * 4
    # the MLP reads h = x + the normed attention output, a tensor of its own
    assert rows[f"{layer}.mlp.gate_proj"].activations == x


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_act": "gelu"}, "gelu_pytorch_tanh"),
        ({"norm_type": "rms_norm"}, "norm_type"),
    ],
)
def test_starcoder2_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "starcoder2-3b", **change)
    assert "E713" in message and words in message


def test_starcoder2_layer_terms():
    """StarCoder2-3B, trained, batch 1, seq 2048 (x = 2048 * 3072 * 2 = 12 MiB): the released
    config's dropouts (0.1) each save a bool mask - residual dropout after o_proj and after
    c_proj, embedding dropout once - and eager's attention dropout one per score."""
    spec = str(ROOT / "specs/starcoder2/starcoder2-3b.yaml")
    layer = "language.layers[0:30]"
    tokens = 2048 * 3072
    sdpa = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048).rows}
    assert sdpa[f"{layer}.self_attn.residual_dropout[0]"].activations == tokens
    assert sdpa[f"{layer}.mlp.residual_dropout[0]"].activations == tokens
    assert sdpa["language.embedding_dropout[0]"].activations == tokens
    scores = 24 * 2048 * 2048
    eager = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048, attention="eager").rows}
    # the fp32 probabilities, the dropped-out bf16 ones and the bool mask, beside k and v repeated to 24 heads
    q = 2048 * 24 * 128 * 2
    assert eager[f"{layer}.self_attn.core"].activations - sdpa[f"{layer}.self_attn.core"].activations == scores * (4 + 2 + 1) + 2 * q - (
        2 * 2048 * 256 * 2 + q + 24 * 2048 * 4 + 16 + 8
    )


@pytest.mark.parametrize(
    "change, words",
    [
        # StableLM 2 12B's layout: parallel residual and per-head q/k LayerNorms
        ({"use_parallel_residual": True}, "use_parallel_residual"),
        ({"qk_layernorm": True}, "qk_layernorm"),
        ({"hidden_dropout": 0.1}, "dropout"),
        ({"hidden_act": "gelu"}, "SwiGLU"),
    ],
)
def test_stablelm_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "stablelm-2-1_6b", **change)
    assert "E713" in message and words in message


def test_stablelm_layer_terms():
    """StableLM-2-1.6B, trained, sdpa, batch 1, seq 2048 (x = 2048 * 2048 * 2 = 8 MiB): rotary on
    16 of 64 dimensions per head, o_proj reading the flash output's contiguous copy, and the
    q_proj and k_proj outputs alive through the kernel (query_pass, key_pass)."""
    est = api.estimate(str(ROOT / "specs/stablelm/stablelm-2-1_6b.yaml"), micro_batch=1, seq_len=2048)
    rows = {r.path: r for r in est.rows}
    layer = "language.layers[0:24]"
    x = 2048 * 2048 * 2
    assert rows["language.layers[0].self_attn.rotary"].activations == 2 * 2048 * 16 * 2
    assert rows[f"{layer}.self_attn.o_proj"].activations == x
    # q, k, v and the kernel's own output, the fp32 logsumexp [32, 2048], the philox seed and offset
    assert rows[f"{layer}.self_attn.core"].activations == 4 * x + 32 * 2048 * 4 + 16 + 8
    # o_proj has no bias; q, k and v have one
    assert rows[f"{layer}.self_attn.o_proj"].parameters == 2048 * 2048 * 2
    assert rows[f"{layer}.self_attn.q_proj"].parameters == (2048 * 2048 + 2048) * 2


def test_granite_is_llama_with_its_multipliers():
    """Granite-3.0-2B: Llama's layers (the multipliers save nothing); the released config's
    attention dropout saves a bool mask per score under eager only, and with LoRA and
    checkpointing both the embedding module's output and its scaled copy are kept."""
    spec = str(ROOT / "specs/granite/granite-3.0-2b-base.yaml")
    core = "language.layers[0:40].self_attn.core"
    scores = 32 * 2048 * 2048
    sdpa = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048).rows}
    eager = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048, attention="eager").rows}
    # eager keeps the fp32 and the dropped-out bf16 probabilities and the bool mask, beside q and
    # k and v repeated to 32 heads (4 x 2048 x 2048 x 2); flash keeps q, k and v unrepeated, its
    # output, the logsumexp and the philox seed and offset
    q = 2048 * 2048 * 2
    assert eager[core].activations == scores * (4 + 2 + 1) + 3 * q
    assert sdpa[core].activations == 2 * q + 2 * (q // 4) + 32 * 2048 * 4 + 16 + 8
    x = 2 * 2048 * 2048 * 2
    lora = {r.path: r for r in api.estimate(spec, micro_batch=2, seq_len=2048, lora={"r": 16}, gradient_checkpointing=["language"]).rows}
    assert lora["language.embed_tokens"].activations == 2 * x


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_act": "gelu"}, "SwiGLU"),
        ({"attention_dropout": 0.1}, "dropout"),
    ],
)
def test_cohere_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "aya-expanse-8b", **change)
    assert "E713" in message and words in message


def test_cohere_layer_terms():
    """Aya-Expanse-8B, trained, sdpa, batch 1, seq 2048 (x = 2048 * 4096 * 2 = 16 MiB): CohereLayerNorm
    saves two fp32 copies of x - mean, the fp32 normalised x, rstd and the fp32 weight; the
    rotary saves the model's 16-bit cos and sin and upcasts q and k for its products; LoRA on
    the MLP alone makes the first layer's SiLU and product save though no gradient enters it."""
    spec = str(ROOT / "specs/cohere/aya-expanse-8b.yaml")
    rows = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048).rows}
    layer = "language.layers[0:32]"
    x32 = 2048 * 4096 * 4
    assert rows[f"{layer}.input_layernorm"].activations == 3 * x32 + 2048 * 4 + 4096 * 4
    assert rows[f"{layer}.input_layernorm"].parameters == 4096 * 2
    assert rows["language.layers[0].self_attn.rotary[0]"].activations == 2 * 2048 * 128 * 2
    # the 16-bit q and k, their fp32 copies and q's three fp32 products (32 query, 8 key-value heads)
    q, k = 2048 * 32 * 128, 2048 * 8 * 128
    assert rows["language.layers[0].self_attn.rotary[0]"].transient_forward == 2 * (q + k) + 4 * (q + k) + 3 * 4 * q
    # the tied head counts the table once
    assert rows["language.lm_head"].parameters == 256000 * 4096 * 2
    assert rows["language.embed_tokens"].parameters == 0
    mlp_only = {
        r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048, lora={"r": 16, "target_modules": ["gate_proj", "up_proj", "down_proj"]}).rows
    }
    assert mlp_only[f"{layer}.mlp.act"].activations == 2048 * 14336 * 2


@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_act": "gelu"}, "SwiGLU"),
        ({"attention_dropout": 0.1}, "dropout"),
        ({"use_qk_norm": True}, "use_qk_norm"),
    ],
)
def test_cohere2_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "c4ai-command-r7b-12-2024", **change)
    assert "E713" in message and words in message


def test_cohere2_global_layers_skip_the_rotary():
    """Command R7B, trained, batch 1, seq 2048: 24 sliding-window layers with the rotary and 8
    global ones without; eager materialises both the causal and the sliding mask [b, 1, s, s]."""
    spec = str(ROOT / "specs/cohere2/c4ai-command-r7b-12-2024.yaml")
    rows = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048).rows}
    assert "language.layers[0].self_attn.rotary[0]" in rows
    assert not any(p.startswith("language.global_layers") and ".rotary" in p for p in rows)
    # the kernel saves q, k and v (the projections' own outputs in a global layer) as in a sliding one
    assert rows["language.global_layers[0:8].self_attn.core"].activations == rows["language.layers[0:24].self_attn.core"].activations
    eager = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048, attention="eager").rows}
    assert eager["language"].transient_forward - rows["language"].transient_forward == 2 * 2048 * 2048 * 2


@pytest.mark.parametrize(
    "change, words",
    [
        # OPT-350m's layout: LayerNorm after each block, 512-wide embeddings projected in and out
        ({"do_layer_norm_before": False}, "do_layer_norm_before"),
        ({"word_embed_proj_dim": 512}, "project_in"),
        ({"activation_function": "gelu"}, "ReLU"),
        ({"attention_dropout": 0.1}, "attention dropout"),
        ({"tie_word_embeddings": False}, "untied"),
    ],
)
def test_opt_variants_not_modelled_are_refused(tmp_path, change, words):
    message = _import_with(tmp_path, "opt-1.3b", **change)
    assert "E713" in message and words in message


def test_opt_layer_terms():
    """OPT-1.3B, trained, batch 1, seq 2048 (x = 2048 * 2048 * 2 = 8 MiB): the released config's
    dropout (0.1) saves a bool mask after out_proj and after fc2; ReLU saves its output, which
    fc2 reads (one tensor); the scaled query is the kernel's q; the position table's lookup
    saves its own int64 indices (position_ids + 2)."""
    spec = str(ROOT / "specs/opt/opt-1.3b.yaml")
    layer = "language.layers[0:24]"
    tokens = 2048 * 2048
    x = tokens * 2
    rows = {r.path: r for r in api.estimate(spec, micro_batch=1, seq_len=2048).rows}
    assert rows[f"{layer}.attn_dropout[0]"].activations == tokens
    assert rows[f"{layer}.mlp_dropout[0]"].activations == tokens
    assert rows[f"{layer}.activation_fn"].activations == 4 * x
    assert rows[f"{layer}.fc2"].activations is None or rows[f"{layer}.fc2"].activations == 0
    assert rows[f"{layer}.fc1"].activations == x
    assert rows["language.embed_positions"].activations == 2048 * 8
    assert rows["language.embed_positions"].parameters == 2050 * 2048 * 2
    assert rows["language.embed_tokens"].parameters == 0  # the tied table is lm_head's
