"""Qwen (first generation) as a text-only model (the qwen family): the import of the remote-code
checkpoint, the terms its layers and loss hold, with the arithmetic, and what it refuses.
No measured record: there is no Qwen (QWenLMHeadModel) class in transformers to trace (see the
family's notes)."""

from __future__ import annotations

from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.errors import MemspecError
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "qwen" / "qwen-7b.yaml"
TOKENS, HIDDEN, VOCAB, FF = 4096, 4096, 151936, 11008
X = TOKENS * HIDDEN * 2  # one [4096, 4096] bf16 tensor: 33_554_432
LAYERS = "language.h[0:32]"


@pytest.mark.parametrize(("spec", "fixture", "ff"), [("qwen-7b", "Qwen-7B", 11008), ("qwen-1_8b", "Qwen-1_8B", 5504)])
def test_the_checked_in_spec_is_what_import_writes(spec, fixture, ff):
    written = api.load_spec(ROOT / "specs" / "qwen" / f"{spec}.yaml")
    imported = importer.import_spec(str(hf.FIXTURES / fixture)).spec
    assert hf.modules(written) == hf.modules(imported)
    language = written.modules[0].inputs
    # w1 and w2 are intermediate_size // 2 wide (22016 // 2, 11008 // 2); no_bias true
    assert (language["ff"], language["head_dim"], language["bias"]) == (ff, 128, False)
    assert written.attention == ("flash_attention_2", "sdpa")


def _rows(attention: str, micro_batch: int = 1, **overrides) -> dict:
    est = api.estimate(str(SPEC), micro_batch=micro_batch, seq_len=TOKENS, attention=attention, **overrides)
    return {r.path: r for r in est.rows}


def test_parameters_and_buffers():
    rows = _rows("flash_attention_2")
    # c_attn [3 * 4096, 4096] with its bias, attn.c_proj [4096, 4096], bf16
    assert rows[LAYERS + ".attn.c_attn"].parameters == (12288 * 4096 + 12288) * 2
    assert rows[LAYERS + ".attn.c_proj"].parameters == 4096 * 4096 * 2
    # w1, w2 [11008, 4096] and mlp.c_proj [4096, 11008]
    assert rows[LAYERS + ".mlp.w1"].parameters == rows[LAYERS + ".mlp.w2"].parameters == FF * 4096 * 2
    assert rows[LAYERS + ".mlp.c_proj"].parameters == 4096 * FF * 2
    # every layer's logn_tensor [1, 32767, 1, 1] and masked_bias, in the model's bf16
    assert rows[LAYERS + ".attn"].buffers == 32767 * 2 + 2
    # input_ids, labels 2 * 4096 * 8; inv_freq 64 * 4; the fp32 cos / sin cache of 2 * 4096 rows
    assert rows["language"].buffers == 2 * TOKENS * 8 + 64 * 4 + 2 * (2 * TOKENS) * 128 * 4


def test_flash_attention_terms():
    rows = _rows("flash_attention_2")
    # v, a view of c_attn's output, saved by flash-attn: q's and k's thirds stay alive
    assert rows[LAYERS + ".attn"].activations == 2 * X
    # the kernel: the rotated q and k, v, the output (c_proj's input) 4 * X, lse 32 * 4096 * 4, philox 16 + 8
    assert rows[LAYERS + ".attn.core"].activations == 4 * X + 32 * TOKENS * 4 + 24
    # flash-attn's rotary kernel, at k: the rotated q and v's third (2 * X), k.float() and the
    # kernel's fp32 result (2 * 2 * X), their cast (X)
    assert rows[LAYERS + ".attn.rotary"].transient_forward == 7 * X
    # the split's backward: dq, dk, dv and their cat into c_attn's output gradient
    assert rows[LAYERS + ".attn.rotary"].transient_backward == 6 * X
    # the normed input x, saved once by c_attn; w1 and w2 share the MLP's input the same way
    assert rows[LAYERS + ".attn.c_attn"].activations == X
    assert rows[LAYERS + ".mlp.w1"].activations == X and rows[LAYERS + ".mlp.w2"].activations is None


def test_sdpa_saves_each_layers_own_mask():
    rows = _rows("sdpa", micro_batch=2)
    tokens = 2 * TOKENS
    # the memory-efficient kernel: q, k, v, out 4 * 8192 * 4096 * 2, lse 2 * 32 * 4096 * 4, seed and
    # offset 8 + 8, and the additive copy of this layer's [1, 1, s, s] causal mask (not per sample)
    assert rows[LAYERS + ".attn.core"].activations == 4 * tokens * HIDDEN * 2 + 2 * 32 * TOKENS * 4 + 16 + TOKENS * TOKENS * 2
    # the bool mask torch.tril makes, beside convert_boolean_attn_mask's logical_not
    assert rows[LAYERS + ".attn"].transient_forward == 2 * TOKENS * TOKENS
    # the torch rotary, at k: the rotated q and v's third, then four fp32 tensors of k's size
    assert rows[LAYERS + ".attn.rotary"].transient_forward == 2 * tokens * HIDDEN * 2 + 4 * tokens * HIDDEN * 4


def test_flash_varlen_saves_cu_seqlens():
    # batch 2: flash_attn_varlen_func saves cu_seqlens_q and cu_seqlens_k, int32 [3], a block each
    assert _rows("flash_attention_2", micro_batch=2)[LAYERS + ".attn"].activations == 2 * 2 * X + 2 * 512
    assert _rows("flash_attention_2")[LAYERS + ".attn"].activations == 2 * X


def test_loss_over_the_shifted_bf16_logits():
    loss = _rows("flash_attention_2")["language.loss"]
    # log_softmax of the bf16 shift_logits [4095, 151936] (rounded to 512 B), saved; the labels'
    # shifted slice a view at batch 1; total_weight, the loss and its seed gradient, bf16 scalars
    shifted = -(-(TOKENS - 1) * VOCAB * 2 // 512) * 512
    assert loss.activations == shifted + 3 * 2
    # the bf16 logits the model returns, no fp32 copy; their [:, :-1] slice is contiguous at batch 1
    # (a size-1 dimension's stride is not checked), so .contiguous() copies nothing
    assert loss.transient_forward == TOKENS * VOCAB * 2
    # two samples: the slice is copied, [2, 4095, 151936] bf16 beside the logits
    two = _rows("flash_attention_2", micro_batch=2)["language.loss"]
    assert two.transient_forward == 2 * TOKENS * VOCAB * 2 + -(-2 * (TOKENS - 1) * VOCAB * 2 // 512) * 512


def test_lora_on_qwens_own_names():
    # Qwen's finetune.py: lora_target_modules c_attn, c_proj, w1, w2 (c_proj: the attention's and the MLP's)
    rows = _rows("flash_attention_2", lora={"r": 64, "target_modules": ["c_attn", "c_proj", "w1", "w2"]})
    adapted = sorted(p.removeprefix(LAYERS + ".") for p, r in rows.items() if r.type == "lora_linear")
    assert adapted == ["attn.c_attn", "attn.c_proj", "mlp.c_proj", "mlp.w1", "mlp.w2"]


def test_eager_has_no_counterpart():
    with pytest.raises(MemspecError) as info:
        _rows("eager")
    assert [d.code for d in info.value.diagnostics] == ["E714"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"kv_channels": 64}, "kv_channels x num_attention_heads == hidden_size"),
        ({"rotary_pct": 0.5}, "partial rotary"),
        ({"attn_dropout_prob": 0.1}, "dropout"),
        ({"emb_dropout_prob": 0.1}, "dropout"),
        ({"fp32": True}, "fp32 true"),
        ({"tie_word_embeddings": True}, "tied lm_head"),
        ({"use_cache_quantization": True}, "use_cache_quantization"),
    ],
)
def test_variants_not_modelled_are_refused(tmp_path, change, words):
    folder = hf.edited_copy(hf.FIXTURES / "Qwen-7B", tmp_path / "Qwen-7B", lambda config: config.update(change))
    with pytest.raises(MemspecError) as info:
        importer.import_spec(folder)
    assert "E713" in str(info.value) and words in str(info.value)


# tp, the fused loss, packing and activation offloading: refused, each with its code, in
# tests/test_setups.py's table (qwen/qwen-7b.yaml: plain steps only)
