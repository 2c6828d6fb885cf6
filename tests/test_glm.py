"""The GLM families (glm: GlmForCausalLM, GLM-4-9B-hf; glm4: Glm4ForCausalLM, GLM-4-0414): each
checked-in spec is what `memspec import` writes from its fixture, its parameter count is the one
transformers' model reports for the same config.json (built on the meta device), peft's
all-linear targets are the linear rows the estimate adapts, the variants the formulas do not
model are refused (the first three in tests/test_llm_families.py), and the layer terms the
traces decided are what the estimate charges."""

from __future__ import annotations

from pathlib import Path

import pytest

import test_llm_families as families
from compiler import api
from compiler.errors import MemspecError

ROOT = Path(__file__).resolve().parent.parent
GLM = ROOT / "specs/glm/glm-4-9b-chat-hf.yaml"
GLM4 = ROOT / "specs/glm4/glm-4-9b-0414.yaml"

# The checked-in specs against import, transformers' parameter counts and peft's all-linear
# targets: tests/test_llm_families.py (MODELS), whose helpers these tests share.


@pytest.mark.parametrize("fixture", ["glm-4-9b-chat-hf", "GLM-4-9B-0414"])
@pytest.mark.parametrize(
    "change, words",
    [
        ({"hidden_act": "gelu"}, "silu"),
        ({"attention_dropout": 0.1}, "dropout"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ],
)
def test_variants_not_modelled_are_refused(tmp_path, fixture, change, words):
    message = families._import_with(tmp_path, fixture, **change)
    assert "E713" in message and words in message


def test_setups_beyond_a_plain_step_are_refused():
    with pytest.raises(MemspecError) as exc:
        api.estimate(str(GLM), micro_batch=1, seq_len=1024, packing=True)
    assert "E316" in exc.value.render() and "glm" in exc.value.render()


def test_glm_layer_terms():
    """GLM-4-9B-hf, trained, sdpa, batch 1, seq 2048 (x = 2048 * 4096 * 2 = 16 MiB; GQA 32 / 2
    heads of 128): the rotary saves this layer's own cos and sin copies (64 of 128 dimensions),
    the flash output and o_proj's contiguous copy of it are two tensors, and the model's cos and
    sin are charged by nobody's rotary."""
    est = api.estimate(str(GLM), micro_batch=1, seq_len=2048)
    rows = {r.path: r for r in est.rows}
    layer = "language.layers[0:40]"
    x = 2048 * 4096 * 2
    assert rows[f"{layer}.self_attn.q_proj"].activations == x
    assert rows[f"{layer}.self_attn.rotary"].activations == 2 * 2048 * 64 * 2
    # q, k and v (2 key-value heads), the kernel's output, the fp32 logsumexp [32, 2048], philox seed and offset
    assert rows[f"{layer}.self_attn.core"].activations == x + 2 * 2048 * 256 * 2 + x + 32 * 2048 * 4 + 16 + 8
    assert rows[f"{layer}.self_attn.o_proj"].activations == x
    # gate_up_proj's input, silu's gate and the product's up (halves of one output), down_proj's input
    f = 2048 * 13696 * 2
    assert rows[f"{layer}.mlp.gate_up_proj"].activations == x
    assert rows[f"{layer}.mlp.down_proj"].activations == f
    assert not any("post_self_attn_layernorm" in p for p in rows)


def test_glm4_post_norms():
    """GLM-4-0414's two extra RMSNorms per layer: each saves an fp32 copy of its input, the
    fp32 rstd and (trained) its bf16 normed product, as the other norms."""
    rows = {r.path: r for r in api.estimate(str(GLM4), micro_batch=1, seq_len=2048).rows}
    layer = "language.layers[0:40]"
    for norm in ("post_self_attn_layernorm", "post_mlp_layernorm"):
        assert rows[f"{layer}.{norm}[0]"].parameters == 4096 * 2
        assert rows[f"{layer}.{norm}[0]"].activations == 2048 * 4096 * (4 + 2) + 2048 * 4


# The remote-code ChatGLM checkpoints (model_type chatglm), imported onto GLM's formulas:
# estimates only (the tracer cannot build remote code). The arithmetic is in tests/test_import.py.
CHATGLM = [
    ("glm-4-9b-chat", ROOT / "specs/chatglm/glm-4-9b-chat.yaml", 9_399_951_360),
    ("chatglm3-6b", ROOT / "specs/chatglm/chatglm3-6b.yaml", 6_243_584_000),
]


@pytest.mark.parametrize("fixture, spec, parameters", CHATGLM)
def test_chatglm_checked_in_spec_is_what_import_writes(fixture, spec, parameters):
    families.test_the_checked_in_spec_is_what_import_writes(fixture, spec, parameters)


def test_chatglm_is_glm_hf_with_the_remote_codes_differences():
    """GLM-4-9B-chat and GLM-4-9B-chat-hf hold the same weights; at batch 1, seq 2048, trained,
    sdpa, the remote code's layer keeps more: k and v copied out to all 32 heads (2 x 30 heads x
    2048 x 128 x 2 bytes over the 2 key-value heads) and, per RMSNorm, the 16-bit input and an
    fp32 (not 16-bit) normed product (2 x 2048 x 4096 x (2 + 2) bytes per layer)."""
    remote = api.estimate(str(ROOT / "specs/chatglm/glm-4-9b-chat.yaml"), micro_batch=1, seq_len=2048)
    port = api.estimate(str(GLM), micro_batch=1, seq_len=2048)
    assert sum(r.parameters or 0 for r in remote.rows) == sum(r.parameters or 0 for r in port.rows)
    layer = {r.path: r for r in remote.rows}
    hf_layer = {r.path: r for r in port.rows}
    core = layer["language.layers[0:40].self_attention.core"].activations
    assert core - hf_layer["language.layers[0:40].self_attn.core"].activations == 2 * 30 * 2048 * 128 * 2
    norm = layer["language.layers[0:40].input_layernorm"].activations
    assert norm - hf_layer["language.layers[0:40].input_layernorm"].activations == 2048 * 4096 * (2 + 2)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"add_bias_linear": True}, "add_bias_linear"),
        ({"pre_seq_len": 128}, "P-Tuning"),
        ({"quantization_bit": 4}, "quantization_bit"),
        ({"apply_residual_connection_post_layernorm": True}, "pre-norm"),
    ],
)
def test_chatglm_variants_not_modelled_are_refused(tmp_path, change, words):
    message = families._import_with(tmp_path, "chatglm3-6b", **change)
    assert "E713" in message and words in message
