"""Which training setups each model is modelled for: the formula files' `setups:` lists.

An estimate refuses packing, activation offloading, the fused linear cross-entropy loss and
tensor / sequence / pipeline parallelism unless every formula its spec instantiates lists the
setup (compiler/pipeline/admit.py, setup_refusals). The table below is what the shipped formulas
allow per spec; a change to a formula's `setups:` shows up here as a diff."""

import shutil
from pathlib import Path

import pytest

from compiler import api
from compiler.errors import MemspecError
from compiler.library.formula import load_library
from compiler.pipeline.admit import admit
from compiler.pipeline.resolve import resolve_setup

ROOT = Path(__file__).resolve().parents[1]
FORMULAS = ROOT / "formulas"
QWEN3 = ROOT / "specs" / "qwen3" / "qwen3-8b.yaml"
BASE = {"micro_batch": 1, "seq_len": 8192, "images_per_sample": 0}  # a text-only batch: packing applies

# the overrides that ask for each setup, by its short name in the table
ASK = {
    "pack": {"packing": True},
    "offload": {"activation_offloading": True},
    "fused": {"loss": "fused_linear_cross_entropy"},
    "tp": {"tp": 2},
    "sp": {"tp": 2, "sp": True},
    "pp": {"pp": 2},
}
CODES = {"pack": "E316", "offload": "E316", "fused": "E317", "tp": "E318", "sp": "E318", "pp": "E318"}

# spec -> the setups an estimate accepts with a text-only batch. Gemma's causal LM has no
# packed / offloaded / fused-loss / tp branch; InternLM2's remote-code layers (internlm2_*,
# also InternVL 2.5's language model) list none; Phi-3's fused projections, the MoE layers and
# every vision tower list no tp / sp / pp; towers and projectors list the fused loss, which
# does not change them, and run on no rows of a text-only batch.
ALLOWED = {
    "chatglm/chatglm3-6b.yaml": "",  # the remote-code ChatGLM: estimates for plain steps only
    "chatglm/glm-4-9b-chat.yaml": "",
    "chatglm_vision/glm-4v-9b.yaml": "",  # GLM-4V-9B's remote code: plain steps only
    "cogvlm2/cogvlm2-llama3-chat-19b.yaml": "",  # CogVLM2's remote code: plain steps only
    "cogvlm/cogvlm-chat-hf.yaml": "",  # CogVLM v1's remote code: plain steps only
    "baichuan/baichuan2-7b-base.yaml": "",  # the remote-code Baichuan2: estimates for plain steps only
    "deepseek_vl/deepseek-vl-1.3b-chat.yaml": "pack offload fused",
    "deepseek_v2/deepseek-v2-lite.yaml": "",  # multi-head latent attention and DeepSeek's MoE: plain steps only
    "deepseek_v2/deepseek-v2.yaml": "",
    "deepseek_v3/moonlight-16b-a3b.yaml": "",
    "mistral3/mistral-small-3.1-24b-instruct.yaml": "pack offload fused",
    "falcon/falcon-40b.yaml": "",  # GPT-NeoX, Phi and Falcon: measured on plain steps only
    "bloom/bloom-560m.yaml": "",  # BLOOM: measured on plain steps only
    "bloom/bloomz-7b1.yaml": "",
    "gemma/gemma-2b.yaml": "",
    "glm/glm-4-9b-chat-hf.yaml": "",  # GLM and GLM-4-0414: measured on plain steps only
    "glm4/glm-4-9b-0414.yaml": "",
    "glm4v/glm-4.1v-9b-thinking.yaml": "",
    "minicpmv4_6/minicpm-v-4.6.yaml": "",  # Qwen3.5 text with the torch reference linear attention: plain steps only
    "mllama/llama-3.2-11b-vision-instruct.yaml": "",  # the cross-attention layers and the tiled tower: plain steps only
    "mllama/llama-3.2-90b-vision-instruct.yaml": "",
    "gemma2/gemma-2-2b.yaml": "",
    "gemma2/gemma-2-9b.yaml": "",
    "gemma3/gemma-3-12b-it.yaml": "",
    "gemma3/gemma-3-1b-pt.yaml": "",
    "gemma3/gemma-3-27b-it.yaml": "",
    "gemma3/gemma-3-4b-it.yaml": "",
    "gpt_neox/pythia-1.4b.yaml": "",
    "granite/granite-3.0-2b-base.yaml": "pack offload fused tp sp pp",
    "cohere/aya-expanse-8b.yaml": "",
    "cohere2/c4ai-command-r7b-12-2024.yaml": "",
    "aya_vision/aya-vision-8b.yaml": "",  # the cohere2 formulas: plain steps only
    "cohere2_vision/command-a-vision-07-2025.yaml": "",  # the cohere2 formulas: plain steps only
    "ovis2/ovis2-1b-hf.yaml": "pack offload fused",
    "ovis2/ovis2-2b-hf.yaml": "pack offload fused",
    "idefics2/idefics2-8b-base.yaml": "pack offload fused",
    "idefics3/idefics3-8b-llama3.yaml": "pack offload fused",
    "idefics3/smolvlm-instruct.yaml": "pack offload fused",
    "idefics3/smolvlm2-500m-video-instruct.yaml": "pack offload fused",
    "idefics3/smolvlm2-2.2b-instruct.yaml": "pack offload fused",
    "internlm2/internlm2_5-7b-chat.yaml": "",
    "internvl/internvl2_5-8b.yaml": "",
    "internvl/internvl3-38b-hf.yaml": "pack offload fused",
    "internvl/internvl3-38b.yaml": "pack offload fused",
    "internvl/internvl3-8b-hf.yaml": "pack offload fused",
    "internvl/internvl3-8b.yaml": "pack offload fused",
    "llama/llama-2-7b.yaml": "pack offload fused tp sp pp",
    "llama/llama-3-8b.yaml": "pack offload fused tp sp pp",
    "llava/llava-1.5-13b.yaml": "pack offload fused",
    "llava/llava-1.5-7b.yaml": "pack offload fused",
    "llava_pixtral/pixtral-12b.yaml": "pack offload fused",
    "llava_next/llava-v1.6-mistral-7b.yaml": "pack offload fused",
    "llava_next/llava-v1.6-vicuna-7b.yaml": "pack offload fused",
    "llava_next_video/llava-next-video-7b.yaml": "pack offload fused",
    "llava_onevision/llava-onevision-qwen2-0.5b-ov.yaml": "pack offload fused",
    "llava_onevision/llava-onevision-qwen2-7b-ov.yaml": "pack offload fused",
    "mistral/mistral-7b-v0.1.yaml": "pack offload fused tp sp pp",
    "mixtral/mixtral-8x7b-v0.1-router-aux.yaml": "pack offload fused",
    "mixtral/mixtral-8x7b-v0.1.yaml": "pack offload fused",
    "olmo2/OLMo-2-0425-1B.yaml": "",
    "paligemma/paligemma-3b-pt-224.yaml": "",
    "paligemma/paligemma2-3b-pt-448.yaml": "",
    "paligemma/paligemma2-3b-pt-896.yaml": "",
    "phi/phi-1_5.yaml": "",
    "phi/phi-2.yaml": "",
    "phi3/phi-3-mini-4k-instruct.yaml": "pack offload fused",
    "phi3_v/phi-3-vision-128k-instruct.yaml": "",  # the remote-code Phi3V layers (phi3v_rope_table): plain steps only
    "phi3_v/phi-3.5-vision-instruct.yaml": "",
    "stablelm/stablelm-2-1_6b.yaml": "",
    "starcoder2/starcoder2-3b.yaml": "",
    "opt/opt-1.3b.yaml": "",  # OPT: measured on plain steps only
    "opt/opt-6.7b.yaml": "",
    "blip_2/blip2-opt-2.7b.yaml": "",  # BLIP-2: measured on plain steps only
    "qwen/qwen-1_8b.yaml": "",  # the remote-code Qwen (first generation): estimates for plain steps only
    "qwen/qwen-7b.yaml": "",
    "qwen_vl/qwen-vl-chat.yaml": "",  # the remote-code Qwen-VL: estimates for plain steps only
    "minicpmv/minicpm-v-2_6.yaml": "",  # the remote-code MiniCPM-V 2.6: estimates for plain steps only
    "internlm_xcomposer2/internlm-xcomposer2-vl-7b.yaml": "",  # the remote-code PLoRA layers: plain steps only
    "internlm_xcomposer2_4khd/internlm-xcomposer2-4khd-7b.yaml": "",  # the same PLoRA layers, phi3v_hd_projector: plain steps only
    "qwen2/qwen2.5-0.5b.yaml": "pack offload fused tp sp pp",
    "qwen2/qwen2.5-7b.yaml": "pack offload fused tp sp pp",
    "qwen2_moe/qwen1.5-moe-a2.7b-router-aux.yaml": "pack offload fused",
    "qwen2_moe/qwen1.5-moe-a2.7b.yaml": "pack offload fused",
    "qwen2_moe/qwen2-57b-a14b.yaml": "pack offload fused",
    "qwen2_vl/qwen2-vl-7b-instruct.yaml": "pack offload fused",
    "qwen2_vl/qwen2.5-vl-7b-instruct.yaml": "pack offload fused",
    "qwen3/qwen3-8b.yaml": "pack offload fused tp sp pp",
    "qwen3_vl/qwen3-vl-2b-instruct.yaml": "pack offload fused",
    "qwen3_vl/qwen3-vl-8b-instruct.yaml": "pack offload fused",
    "qwen3_moe/qwen3-30b-a3b.yaml": "pack offload fused",
    "t5/flan-t5-base.yaml": "",  # T5's encoder-decoder formulas: plain steps only
    "t5/flan-t5-large.yaml": "",
    "t5/flan-t5-xl.yaml": "",
    "t5/t5-base.yaml": "",
    # Yi-VL (the -hf conversions): LLaVA's table; the projector's LayerNorms run on no row of a text-only batch
    "yi_vl/yi-vl-6b-hf.yaml": "pack offload fused",
    "yi_vl/yi-vl-34b-hf.yaml": "pack offload fused",
}


def _allowed(spec_path: Path, library=None) -> str:
    spec = api.load_spec(spec_path)
    ok = []
    for name, overrides in ASK.items():
        try:
            api.admitted_setup(None, spec, {**BASE, **overrides}, formulas=library)
            ok.append(name)
        except MemspecError as exc:
            assert [d.code for d in exc.diagnostics] == [CODES[name]], (spec_path, name, [d.message for d in exc.diagnostics])
    return " ".join(ok)


def test_the_table_covers_every_bare_spec():
    specs = sorted(
        str(p.relative_to(ROOT / "specs"))
        for p in (ROOT / "specs").glob("*/*.yaml")
        if p.parent.name not in ("families", "matrices", "experiments") and "\nmodules:" in p.read_text()
    )
    assert specs == sorted(ALLOWED)


@pytest.mark.parametrize("spec", sorted(ALLOWED))
def test_setups_allowed_per_spec(spec):
    assert _allowed(ROOT / "specs" / spec) == ALLOWED[spec]


def _copy_without(tmp_path: Path, layer_type: str, setup: str) -> Path:
    folder = tmp_path / "formulas"
    shutil.copytree(FORMULAS, folder)
    path = folder / f"{layer_type}.yaml"
    text = path.read_text()
    line = next(row for row in text.splitlines() if row.startswith("setups: ["))
    kept = [s for s in line[len("setups: [") : -1].split(", ") if s != setup]
    assert len(kept) == len(line.split(", ")) - 1, f"{layer_type} lists no {setup}"
    path.write_text(text.replace(line, f"setups: [{', '.join(kept)}]"))
    return folder


def test_a_formula_that_drops_packing_refuses_it_and_is_named(tmp_path):
    spec = api.load_spec(QWEN3)
    # the shipped formulas: Qwen3's layers all list packing
    assert api.admitted_setup(None, spec, {**BASE, "packing": True}, formulas=load_library(FORMULAS)).packing
    folder = _copy_without(tmp_path, "swiglu_mlp", "packing")
    with pytest.raises(MemspecError) as info:
        api.admitted_setup(None, spec, {**BASE, "packing": True}, formulas=load_library(folder))
    (d,) = info.value.diagnostics
    assert (d.code, d.path) == ("E316", "--packing")
    assert "layer type 'swiglu_mlp' of module 'language'" in d.message
    assert "language.layers[0].mlp" in d.message  # its first instance
    assert f"{folder / 'swiglu_mlp.yaml'} does not list packing under setups" in d.message
    # what the copy still lists is allowed
    assert api.admitted_setup(None, spec, {**BASE, "activation_offloading": True}, formulas=load_library(folder)).activation_offloading


def test_a_formula_that_drops_tensor_parallel_refuses_tp_only(tmp_path):
    folder = _copy_without(tmp_path, "rms_norm", "tensor_parallel")
    library = load_library(folder)
    spec = api.load_spec(QWEN3)
    with pytest.raises(MemspecError) as info:
        api.admitted_setup(None, spec, {**BASE, "tp": 2}, formulas=library)
    (d,) = info.value.diagnostics
    assert (d.code, d.path) == ("E318", "--tp") and "'rms_norm'" in d.message and "rms_norm.yaml" in d.message
    assert api.admitted_setup(None, spec, {**BASE, "pp": 2}, formulas=library).pp == 2


def test_internlm2_is_refused_through_its_layer_types_not_the_flag():
    # llama_causal_lm lists packing; with internlm2: true it instantiates internlm2_decoder_layer,
    # which does not
    assert "packing" in load_library(FORMULAS, {"llama_causal_lm"})["llama_causal_lm"].setups
    spec = api.load_spec(ROOT / "specs" / "internlm2" / "internlm2_5-7b-chat.yaml")
    with pytest.raises(MemspecError) as info:
        api.admitted_setup(None, spec, {**BASE, "packing": True})
    (d,) = info.value.diagnostics
    assert d.code == "E316" and "'internlm2_decoder_layer'" in d.message and "formulas/internlm2_decoder_layer.yaml" in d.message


def test_resolve_reads_the_setup_and_admit_refuses_it():
    # resolve runs no formula: the setup it reads is refused by admit, the stage after expand
    spec = api.load_spec(ROOT / "specs" / "internlm2" / "internlm2_5-7b-chat.yaml")
    knobs = {**BASE, "packing": True}
    setup = resolve_setup(None, spec, knobs)
    assert setup.packing
    with pytest.raises(MemspecError) as info:
        admit(None, spec, setup, knobs)
    assert [(d.code, d.path) for d in info.value.diagnostics] == [("E316", "--packing")]
    assert admit(None, spec, resolve_setup(None, spec, BASE), BASE) == resolve_setup(None, spec, BASE)
