"""InternLM2 / InternLM2.5 as a text-only model (the internlm2 family): the import of the remote-code
checkpoint, and the terms its layers and loss add to Llama's, with the arithmetic.
No measured record: there is no InternLM2 class in transformers to trace (see the family's notes).
"""

from __future__ import annotations

from pathlib import Path

import hubfixtures as hf
from compiler import api
from compiler.inputs import importer

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "internlm2" / "internlm2_5-7b-chat.yaml"
TOKENS, HIDDEN, VOCAB = 4096, 4096, 92544


def test_the_checked_in_spec_is_what_import_writes():
    written = api.load_spec(SPEC)
    imported = importer.import_spec(str(hf.FIXTURES / "internlm2_5-7b-chat")).spec
    assert hf.modules(written) == hf.modules(imported)
    language = written.modules[0].inputs
    assert (language["internlm2"], language["attention_bias"], language["positions"]) == (True, False, 32768)


def _rows(attention: str) -> dict:
    est = api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, attention=attention)
    return {r.path: r for r in est.rows}


def test_layers_and_loss_terms():
    rows = _rows("flash_attention_2")
    layers = "language.internlm2_layers[0:32]"
    assert not any(p.startswith("language.layers[") for p in rows)
    # wqkv [(32 + 2 * 8) * 128, 4096] and wo [4096, 4096], bf16
    assert rows[layers + ".attention.wqkv"].parameters == 6144 * 4096 * 2
    assert rows[layers + ".attention.wo"].parameters == 4096 * 4096 * 2
    # every layer's cos_cached and sin_cached [32768, 128] bf16 + inv_freq [64] fp32
    assert rows[layers + ".attention"].buffers == 2 * 32768 * 128 * 2 + 64 * 4
    # flash saves v as a view of the wqkv output: q's and k's parts stay alive, 4096 x (4096 + 1024) x 2
    assert rows[layers + ".attention"].activations == TOKENS * (4096 + 1024) * 2
    # the q copy (einops' merge of the head and group axes) lives through the rotary: 4096 x 4096 x 2
    assert rows[layers + ".attention"].transient_forward == TOKENS * 4096 * 2
    # wqkv's gradient from three slice / select backwards, two whole ones alive: 2 x 4096 x 6144 x 2
    assert rows[layers + ".attention"].transient_backward == 2 * TOKENS * 6144 * 2
    # the remote code's loss: log-probs over s - 1 positions, fp32; the labels' shifted slice is a
    # view at batch 1; three fp32 scalars (nll_loss's total_weight, the loss, its seed gradient)
    loss = rows["language.loss"]
    assert loss.activations == 4095 * VOCAB * 4 + 3 * 4
    # the fp32 logits the model returns; their [:, :-1] slice is already contiguous at batch 1, so
    # .contiguous() copies nothing (at batch 2 it copies [2, 4095, 92544] fp32: formulas/causal_lm_loss.yaml)
    assert loss.transient_forward == TOKENS * VOCAB * 4


def test_eager_repeats_kv_and_keeps_no_view():
    rows = _rows("eager")
    layers = "language.internlm2_layers[0:32]"
    # grouped heads (32 / 8): repeat_kv copies k and v, so nothing saves v's view of the wqkv output
    assert rows[layers + ".attention"].activations == 0
    # the wqkv output then lives only while the attention's forward runs (its local qkv_states), with the q copy
    assert rows[layers + ".attention"].transient_forward == TOKENS * 4096 * 2 + TOKENS * (4096 + 1024) * 2


import pytest  # noqa: E402

from compiler.errors import MemspecError  # noqa: E402


@pytest.mark.parametrize(
    ("override", "code"),
    [
        ({"tp": 2}, "E318"),  # the fused wqkv is not split by tp
        ({"loss": "fused_linear_cross_entropy"}, "E317"),  # the remote code's own cross-entropy
        ({"packing": True}, "E316"),  # its layers build their own masks
        ({"activation_offloading": True}, "E316"),
    ],
)
def test_setups_not_modelled_for_internlm2_are_refused(override, code):
    with pytest.raises(MemspecError) as info:
        api.estimate(str(SPEC), micro_batch=1, seq_len=TOKENS, **override)
    assert code in [d.code for d in info.value.diagnostics]


def test_a_text_only_spec_has_no_image_by_default():
    """No --images-per-sample: 0 for a spec without image tokens (packing needs a text-only batch)."""
    est = api.estimate(str(ROOT / "specs" / "qwen2" / "qwen2.5-0.5b.yaml"), micro_batch=1, seq_len=1024, packing=True)
    assert est.setup.images_per_sample == 0
