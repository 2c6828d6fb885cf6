"""peft's modules_to_save and bias options of LoRA, worked through by hand.

Qwen2.5-0.5B (specs/qwen2/qwen2.5-0.5b.yaml): hidden h = 896, 24 layers, 14 heads and 2
key/value heads of 64 (q 896, k 128, v 128 outputs, each with a bias: q/k/v only), vocabulary
V = 151936, tied embeddings (one V x h table, counted by lm_head). LLaVA-1.5-7B: CLIP ViT-L/14
(24 layers of hidden 1024, MLP 4096; every linear and LayerNorm has a bias), projector
1024 -> 4096 -> 4096 with biases, a Llama language model without biases.
bf16 mixed AdamW: 2 bytes per weight and gradient, 12 bytes of optimizer states per trainable
element (fp32 master + exp_avg + exp_avg_sq).
"""

import pytest

from compiler.api import estimate
from compiler.errors import MemspecError, UsageError

QWEN = "specs/qwen2/qwen2.5-0.5b.yaml"
LLAVA = "specs/llava/llava-1.5-7b.yaml"
V, H, LAYERS = 151936, 896, 24
TABLE = V * H  # 136_134_656 elements
QKV_BIAS = 896 + 128 + 128  # 1152 per layer


def qwen(**lora):
    return estimate(
        QWEN,
        micro_batch=2,
        seq_len=1024,
        trainable=[],
        attention="sdpa",
        gradient_checkpointing=[],
        lora={"r": 16, "alpha": 16, "target_modules": "all-linear", **lora},
    )


def rows(report):
    return {r.path: r for r in report.rows}


@pytest.fixture(scope="module")
def plain():
    return qwen()


@pytest.mark.parametrize(
    "saves, copies",
    [
        (["lm_head", "embed_tokens"], 2),
        (["lm_head"], 1),
        (["embed_tokens"], 1),
    ],
)
def test_tied_tables_copied_untied(plain, saves, copies):
    """Each name copies one table: the copy is a V x h table of its own (deepcopy unties it),
    trained in full; the originals keep sharing their one table, frozen."""
    r = qwen(modules_to_save=saves)
    assert r.estimate.trainable_params - plain.estimate.trainable_params == copies * TABLE  # 136_134_656 each
    lang, base = r.estimate.resident["language"], plain.estimate.resident["language"]
    assert lang["parameters"] - base["parameters"] == copies * TABLE * 2
    assert lang["gradients"] - base["gradients"] == copies * TABLE * 2  # 272_269_312 per table
    assert lang["optimizer_states"] - base["optimizer_states"] == copies * TABLE * 12


def test_wrapper_rows_name_the_original_and_the_copy():
    t = rows(qwen(modules_to_save=["lm_head", "embed_tokens"]))
    head, head_copy = t["language.lm_head.original_module"], t["language.lm_head.modules_to_save"]
    assert t["language.lm_head"].type == "modules_to_save"
    # the original: the tied table (it counts it), frozen and never run: nothing saved or held
    assert (head.parameters, head.gradients, head.optimizer_states, head.trainable, head.grad_flows) == (TABLE * 2, 0, 0, False, False)
    assert (head.activations, head.transient_forward, head.transient_backward) == (0, 0, 0)
    # the copy: trained, saving its input (the final norm's output, 2 x 1024 tokens x h)
    assert (head_copy.parameters, head_copy.gradients, head_copy.optimizer_states) == (TABLE * 2, TABLE * 2, TABLE * 12)
    assert head_copy.activations == 2 * 1024 * H * 2  # 3_670_016
    # embed_tokens' original shares lm_head's table (0 bytes of its own); its copy is untied
    assert t["language.embed_tokens.original_module"].parameters == 0
    assert t["language.embed_tokens.modules_to_save"].parameters == TABLE * 2


def test_untied_copies_add_a_second_table_each():
    """Llama-2-7B (untied, V 32000, h 4096): originals 2 tables, copies 2 more."""
    kw = dict(micro_batch=1, seq_len=2048, trainable=[], attention="sdpa", gradient_checkpointing=[])
    lora = {"r": 16, "alpha": 16, "target_modules": "all-linear"}
    base = estimate("specs/llama/llama-2-7b.yaml", **kw, lora=lora)
    saved = estimate("specs/llama/llama-2-7b.yaml", **kw, lora={**lora, "modules_to_save": ["lm_head", "embed_tokens"]})
    assert saved.estimate.trainable_params - base.estimate.trainable_params == 2 * 32000 * 4096  # 262_144_000
    # the originals stay: 4 tables in all, the copies' 2 more parameters
    assert saved.parameters["language"] - base.parameters["language"] == 2 * 32000 * 4096


# Each bias gradient is an allocation of its own, rounded up to the allocator's 512 B: q's
# 896 x 2 = 1792 B takes 2048, k's and v's 256 B take 512 each. The fp32 master and the two
# Adam moments (4 B per element each) are multiples of 512 already: 1152 x 12 per layer.
Q_GRAD, KV_GRAD = 2048, 512


@pytest.mark.parametrize(
    "bias, targets, trained, grad_blocks",
    [
        ("lora_only", "all-linear", LAYERS * QKV_BIAS, LAYERS * (Q_GRAD + 2 * KV_GRAD)),  # q, k, v adapted: 24 x 1152 = 27_648
        ("all", "all-linear", LAYERS * QKV_BIAS, LAYERS * (Q_GRAD + 2 * KV_GRAD)),  # every `.bias`: the same (RMSNorm, lm_head have none)
        ("lora_only", ["q_proj"], LAYERS * 896, LAYERS * Q_GRAD),  # only q's bias: 21_504
        ("all", ["q_proj"], LAYERS * QKV_BIAS, LAYERS * (Q_GRAD + 2 * KV_GRAD)),  # still every bias: 27_648
    ],
)
def test_qwen2_biases_train(bias, targets, trained, grad_blocks):
    base = qwen(target_modules=targets)
    r = qwen(target_modules=targets, bias=bias)
    assert r.estimate.trainable_params - base.estimate.trainable_params == trained
    lang, was = r.estimate.resident["language"], base.estimate.resident["language"]
    assert lang["gradients"] - was["gradients"] == grad_blocks  # 73_728 B for all three
    assert lang["optimizer_states"] - was["optimizer_states"] == trained * 12


def test_bias_only_row():
    """k_proj's base layer under bias='lora_only': weight frozen, its 128-element bias trains;
    addmm saves nothing for db = sum(dY)."""
    k = rows(qwen(bias="lora_only"))["language.layers[0:24].self_attn.k_proj.base_layer"]
    assert (k.gradients, k.optimizer_states, k.activations) == (128 * 2, 128 * 12, 0)
    assert k.parameters == (896 * 128 + 128) * 2


CLIP_BIASES = 24 * (4 * 1024 + 4096 + 1024 + 2 * 1024) + 2 * 1024  # 24 x 11_264 + pre/post LayerNorm = 272_384


def test_llava_bias_all_trains_the_frozen_towers_biases_and_gradient_flows_into_it():
    kw = dict(micro_batch=1, seq_len=2048, trainable=["projector"], attention="sdpa", gradient_checkpointing=[])
    lora = {"r": 16, "alpha": 16, "target_modules": "all-linear"}
    base = estimate(LLAVA, **kw, lora=lora)
    r = estimate(LLAVA, **kw, lora={**lora, "bias": "all"})
    # CLIP's biases: per layer q, k, v, out (4 x 1024) + fc1 4096 + fc2 1024 + two LayerNorms
    # (2 x 1024) = 11_264; 24 layers + pre_layrnorm + post_layernorm; the projector trains already
    assert r.estimate.trainable_params - base.estimate.trainable_params == CLIP_BIASES
    t, was = rows(r), rows(base)
    pre = t["vision.pre_layrnorm"]
    assert not was["vision.pre_layrnorm"].grad_flows and pre.grad_flows
    # native_layer_norm saves x (577 tokens x 1024 x 2) and fp32 mean, rstd (2 x 577 x 4)
    assert pre.activations == 577 * 1024 * 2 + 2 * 577 * 4  # 1_186_272
    assert r.allocated - base.allocated >= 24 * 577 * 1024 * 2  # at least each layer's saved LayerNorm input


def test_llava_projector_copy():
    """modules_to_save [multi_modal_projector] (Hugging Face's name of LLaVA's projector): a
    second projector, trained, beside the frozen original."""
    kw = dict(micro_batch=1, seq_len=2048, trainable=[], attention="sdpa", gradient_checkpointing=[])
    lora = {"r": 16, "alpha": 16, "target_modules": "all-linear"}
    base = estimate(LLAVA, **kw, lora=lora)
    r = estimate(LLAVA, **kw, lora={**lora, "modules_to_save": ["multi_modal_projector"]})
    projector = 1024 * 4096 + 4096 + 4096 * 4096 + 4096  # 20_979_712
    assert r.estimate.trainable_params - base.estimate.trainable_params == projector
    t = rows(r)
    assert (t["projector"].type, t["projector.original_module"].type, t["projector.modules_to_save"].type) == (
        "modules_to_save",
        "mlp_projector",
        "mlp_projector",
    )
    assert not t["projector.original_module.linear_1"].trainable and t["projector.modules_to_save.linear_1"].trainable
    assert r.estimate.resident["projector"]["parameters"] - base.estimate.resident["projector"]["parameters"] == projector * 2


def test_unmatched_name_is_an_error_at_its_key(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text(
        f"experiment: x\nmodel: {__import__('os').path.abspath(QWEN)}\nmicro_batch: 1\nseq_len: 512\n"
        "trainable: []\nlora:\n  r: 8\n  modules_to_save: [lm_head, embed_token]\n"
    )
    with pytest.raises(MemspecError) as e:
        estimate(str(path))
    (d,) = e.value.diagnostics
    assert (d.code, d.path, d.line) == ("E320", "$.lora.modules_to_save[1]", 8)
    assert "embed_token" in d.message and "embed_tokens" in d.help


def test_unmatched_flag_is_a_usage_error():
    with pytest.raises(UsageError) as e:
        from compiler.cli import _report, parser

        _report(parser().parse_args(["estimate", QWEN, "--micro-batch", "1", "--seq-len", "512", "--lora-modules-to-save", "lm_hed"]))
    assert e.value.diagnostics[0].code == "E320" and e.value.diagnostics[0].path == "--lora-modules-to-save"


@pytest.mark.parametrize(
    "lora, extra, code",
    [
        # the whole language model wrapped, then lm_head inside it: peft wraps one of them
        ({"modules_to_save": ["language", "lm_head"]}, {}, "E322"),
        # a LoRA layer's inside
        ({"modules_to_save": ["lora_a"]}, {}, "E322"),
        # a copy of a bitsandbytes 4-bit weight cannot require grad
        ({"modules_to_save": ["mlp"]}, {"quantization": {"bits": 4}}, "E322"),
        # bitsandbytes' bias sits inside linear_4bit's formula
        ({"bias": "lora_only"}, {"quantization": {"bits": 4}}, "E323"),
        ({"bias": "all"}, {"dp": 2, "fsdp": {}}, "E321"),
        ({"bias": "all", "use_dora": True}, {}, "E321"),
    ],
)
def test_refused_combinations(lora, extra, code):
    with pytest.raises(MemspecError) as e:
        estimate(QWEN, micro_batch=1, seq_len=512, trainable=[], lora={"r": 8, **lora}, **extra)
    assert code in [d.code for d in e.value.diagnostics]


def test_qlora_with_the_head_saved():
    """lm_head is never quantized (the output embedding): QLoRA may save it."""
    r = estimate(QWEN, micro_batch=1, seq_len=512, trainable=[], quantization={"bits": 4}, lora={"r": 8, "modules_to_save": ["lm_head"]})
    assert rows(r)["language.lm_head.modules_to_save"].gradients == TABLE * 2


def test_no_longer_listed_as_not_modelled():
    r = qwen(modules_to_save=["lm_head"], bias="all")
    assert not [x for x in r.estimate.not_modelled if "peft" in x]
