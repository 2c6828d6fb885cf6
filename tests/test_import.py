"""`memspec import`: specs from config.json + safetensors headers, offline, on header-only fixtures.

The fixtures (tests/fixtures/hub/, written by tests/hubfixtures.py) carry each model's real
config.json and its real tensor names, dtypes and shapes, without the weights. Nothing here
reaches the network: hub ids resolve in a huggingface_hub cache laid out under tmp_path with
offline mode on, and hub failures are raised by a stand-in for the download.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hubfixtures as hf
from compiler import api
from compiler.inputs import hub, importer
from compiler.cli import main
from compiler.errors import MemspecError
from compiler.paths import display, specs_dir
from compiler.pipeline.resolve import resolve_setup

ROOT = Path(__file__).resolve().parent.parent
# Where the family files are, as messages show them: relative in a checkout, the installed
# copy's path in a wheel install.
FAMILIES = display(specs_dir() / "families")
FIX = hf.FIXTURES
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """Offline mode and an empty cache: a test that would reach the network fails instead."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("MEMSPEC_CACHE", str(tmp_path / "memspec-cache"))
    monkeypatch.chdir(ROOT)


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(MemspecError) as exc:
        fn(*args, **kwargs)
    return exc.value.render()


# --------------------------------------------------------------------------- counts


@pytest.mark.parametrize(
    "fixture, modules",
    [
        # 32 * 202_383_360 layers + 2 * 131_072_000 embeddings/head (vocab 32000) + norm 4096
        ("Llama-2-7b-hf", {"language": 6_738_415_616}),
        # 32 * 218_112_000 layers (GQA: k, v 1024 x 4096) + 2 * 525_336_576 (vocab 128256) + 4096
        ("Meta-Llama-3-8B", {"language": 8_030_261_248}),
        # 16 * 60_821_504 layers + one 262_668_288 embedding (tied: no lm_head tensor) + 2048
        ("Llama-3.2-1B", {"language": 1_235_814_400}),
        # 303_507_456 + 20_979_712 + 6_738_939_904 = 7_063_427_072
        ("llava-1.5-7b-hf", {"vision": 303_507_456, "projector": 20_979_712, "language": 6_738_939_904}),
        # Mistral: 32 * 218_112_000 layers (GQA 32 / 8: q, o 4096^2, k, v 1024 x 4096; MLP
        # 3 * 4096 * 14336; norms 2 * 4096) + 2 * 131_072_000 (vocab 32000) + norm 4096
        ("Mistral-7B-v0.1", {"language": 7_241_732_096}),
        # Qwen2.5-7B: 28 * 233_057_792 layers (q 3584^2 + 3584, k, v 512 x 3584 + 512 each, o 3584^2,
        # MLP 3 * 3584 * 18944, norms 2 * 3584) + 2 * 544_997_376 (vocab 152064) + norm 3584
        ("Qwen2.5-7B", {"language": 7_615_616_512}),
        # Qwen2.5-0.5B: 24 * 14_912_384 layers (q 896^2 + 896, k, v 128 x 896 + 128 each, o 896^2,
        # MLP 3 * 896 * 4864, norms 2 * 896) + one tied 136_134_656 table (vocab 151936) + norm 896
        ("Qwen2.5-0.5B", {"language": 494_032_768}),
        # Qwen3-8B: 36 * 192_946_432 layers (q, o 4096^2, k, v 1024 x 4096, q_norm and k_norm 128
        # each, MLP 3 * 4096 * 12288, norms 2 * 4096) + 2 * 622_329_856 (vocab 151936) + norm 4096
        ("Qwen3-8B", {"language": 8_190_735_360}),
        # Phi-3-mini-4k: 32 * 113_252_352 layers (qkv_proj 9216 x 3072, o 3072^2, gate_up_proj
        # 16384 x 3072, down 3072 x 8192, norms 2 * 3072) + 2 * 98_500_608 (vocab 32064) + norm 3072
        ("Phi-3-mini-4k-instruct", {"language": 3_821_079_552}),
        # Pythia-1.4B (gpt_neox): 24 * 50_358_272 layers (query_key_value 6144 x 2048 + 6144, dense
        # 2048^2 + 2048, dense_h_to_4h 8192 x 2048 + 8192, dense_4h_to_h 2048 x 8192 + 2048, two
        # LayerNorms 2 * 4096) + embed_in and embed_out 2 * 103_022_592 (vocab 50304) + final
        # LayerNorm 4096; the per-layer attention.bias, masked_bias and inv_freq buffers left out
        ("pythia-1.4b", {"language": 1_414_647_808}),
        # Phi-2 (phi): 32 * 78_671_360 layers (q, k, v, dense 4 * (2560^2 + 2560), fc1 10240 x 2560
        # + 10240, fc2 2560 x 10240 + 2560, one LayerNorm 2 * 2560) + embed_tokens 131_072_000
        # (vocab 51200) + final LayerNorm 5120 + lm_head 131_072_000 and its bias 51_200
        ("phi-2", {"language": 2_779_683_840}),
        # Phi-1.5: 24 * 50_354_176 layers (q, k, v, dense 4 * (2048^2 + 2048), fc1 8192 x 2048 + 8192,
        # fc2 2048 x 8192 + 2048, LayerNorm 4096) + 104_857_600 + 4096 + 104_857_600 + 51_200
        ("phi-1_5", {"language": 1_418_270_720}),
        # GLM-4-9B-hf (glm): 40 * 203_960_832 layers (q 4096^2 + 4096, k, v 256 x 4096 + 256 each, o
        # 4096^2, gate_up_proj 27392 x 4096, down 4096 x 13696, norms 2 * 4096) + embed_tokens and
        # lm_head 2 * 620_756_992 (vocab 151552) + norm 4096 = 9_399_951_360, the published 9.4B
        ("glm-4-9b-chat-hf", {"language": 9_399_951_360}),
        # GLM-4-9B-0414 (glm4): the same + post_self_attn_layernorm and post_mlp_layernorm 40 * 2 * 4096
        ("GLM-4-9B-0414", {"language": 9_400_279_040}),
        # GLM-4-9B-chat (chatglm, remote code): GLM-4-9B-hf's weights, query_key_value (32 + 2 * 2)
        # * 128 = 4608 x 4096 + 4608 in one tensor; rotary_pos_emb.inv_freq left out (a buffer)
        ("glm-4-9b-chat", {"language": 9_399_951_360}),
        # ChatGLM3-6B: 28 * 203_960_832 layers (as GLM-4-9B's) + word_embeddings and output_layer
        # 2 * 266_338_304 (padded vocab 65024) + final_layernorm 4096 = 6_243_584_000, the published 6.24B
        ("chatglm3-6b", {"language": 6_243_584_000}),
        # GLM-4V-9B (chatglm_vision, remote code): GLM-4-9B-chat's language model; the EVA2-CLIP-E tower
        # proj 1792 * 3 * 14 * 14 + 1792 = 1_055_488 + cls_embedding 1792 + position_embedding 6401 *
        # 1792 = 11_470_592 + 63 * 67_926_784 layers (query_key_value 5376 x 1792 + 5376 = 9_639_168,
        # dense 1792^2 + 1792 = 3_213_056, fc1 15360 x 1792 + 15360 = 27_540_480, fc2 1792 x 15360 +
        # 1792 = 27_526_912, two LayerNorms 2 * 3584) = 4_291_915_264; the projector conv 4096 x 1792
        # x 2 x 2 + 4096 = 29_364_224, linear_proj 4096^2 = 16_777_216, norm1 8192, gate_proj,
        # dense_h_to_4h, dense_4h_to_h 3 * 13696 * 4096 = 168_296_448, boi and eoi 2 * 4096:
        # 214_454_272; 13_906_320_896 in all, the published 13.9B
        ("glm-4v-9b", {"vision": 4_291_915_264, "projector": 214_454_272, "language": 9_399_951_360}),
        # CogVLM2 (cogvlm2, remote code; config.json without model_type, found by its architecture):
        # the language model embed_tokens and lm_head 2 * 128256 * 4096 = 1_050_673_152 + norm 4096 +
        # 32 * 436_221_952 layers (language_expert_query_key_value (4096 + 2 * 8 * 128) = 6144 x 4096 =
        # 25_165_824, vision_expert_query_key_value the same + 6144 bias = 25_171_968, language_ and
        # vision_expert_dense 2 * 4096^2 = 33_554_432, language_ and vision_mlp 2 * 3 * 4096 * 14336 =
        # 352_321_536, two RMSNorms 2 * 4096; rotary_emb.inv_freq left out, a buffer) = 15_009_779_712;
        # the EVA2-CLIP-E tower at 1344 px as GLM-4V-9B's with position_embedding 9217 * 1792 =
        # 16_516_864: 1_055_488 + 1792 + 16_516_864 + 63 * 67_926_784 = 4_296_961_536; the projector
        # conv 1792 x 1792 x 2 x 2 + 1792 = 12_846_848, linear_proj 4096 x 1792 = 7_340_032, norm1
        # 8192, gate_proj, dense_h_to_4h, dense_4h_to_h 3 * 14336 * 4096 = 176_160_768, boi and eoi
        # 8192: 196_364_032; 19_503_105_280 in all (the index's total_size 39_006_214_656 B is these
        # and the 32 x 64 inv_freq values in bf16), the published 19B
        ("cogvlm2-llama3-chat-19B", {"vision": 4_296_961_536, "projector": 196_364_032, "language": 15_009_779_712}),
        # CogVLM v1 (cogvlm, remote code; no model_type, its architecture with Vicuna's vocab_size 32000):
        # the language model embed_tokens and lm_head 2 * 32000 * 4096 = 262_144_000 + norm 4096 + 32 *
        # 404_758_528 layers (language_ and vision_expert_query_key_value 2 * 12288 x 4096 =
        # 100_663_296, no bias; language_ and vision_expert_dense 2 * 4096^2 = 33_554_432; language_
        # and vision_mlp 2 * 3 * 4096 * 11008 = 270_532_608; two RMSNorms 2 * 4096) = 13_214_420_992
        # (Vicuna-7B's 6_738_415_616 and the visual experts 32 * 202_375_168); the EVA2-CLIP-E tower
        # at 490 px: proj 1_055_488 + cls_embedding 1792 + position_embedding 1226 * 1792 = 2_196_992 +
        # 63 * 67_926_784 = 4_282_641_664; the projector, no conv: linear_proj 4096 x 1792 =
        # 7_340_032, norm1 8192, gate_proj, dense_h_to_4h, dense_4h_to_h 3 * 11008 * 4096 =
        # 135_266_304, boi and eoi 8192: 142_622_720; 17_639_685_376 in all, the published 17B
        # (10B vision: tower, projector and the experts 4_282_641_664 + 142_622_720 + 6_476_005_376;
        # 7B language)
        ("cogvlm-chat-hf", {"vision": 4_282_641_664, "projector": 142_622_720, "language": 13_214_420_992}),
        # Falcon-40B (falcon, new decoder architecture): 60 * 679_510_016 layers (query_key_value
        # (128 + 2 * 8) * 64 = 9216 x 8192, dense 8192^2, dense_h_to_4h and dense_4h_to_h
        # 2 * 8192 * 32768, ln_attn and ln_mlp 4 * 8192; no biases) + the tied 65024 x 8192 table
        # 532_676_608 + ln_f 16_384
        ("falcon-40b", {"language": 41_303_293_952}),
        # bloom-560m (bloom): 24 * 12_596_224 blocks (query_key_value 3072 x 1024 + 3072, dense
        # 1024^2 + 1024, dense_h_to_4h and dense_4h_to_h 2 * 4096 * 1024 + 4096 + 1024, input_ and
        # post_attention_layernorm 4 * 1024) + the tied 250880 x 1024 table 256_901_120 +
        # word_embeddings_layernorm 2048 + ln_f 2048: the published 559M
        ("bloom-560m", {"language": 559_214_592}),
        # bloomz-7b1: 30 * 201_379_840 blocks (12288 x 4096 + 12288, 4096^2 + 4096, 2 * 16384 * 4096
        # + 16384 + 4096, 4 * 4096) + 250880 x 4096 = 1_027_604_480 + 8192 + 8192: the published 7.07B
        ("bloomz-7b1", {"language": 7_069_016_064}),
        # OLMo-2-0425-1B (olmo2): 16 * 67_117_056 layers (q, k, v, o 4 * 2048^2, gate, up, down
        # 3 * 2048 * 8192, q_norm and k_norm over the whole projections 2 * 2048, post_attention_
        # and post_feedforward_layernorm 2 * 2048) + embed_tokens and lm_head 2 * 100352 * 2048
        # = 411_041_792 + norm 2048: the published 1.48B
        ("OLMo-2-0425-1B", {"language": 1_484_916_736}),
        # Flan-T5-base (t5): the shared 32128 x 768 table 24_674_304 (lm_head's, tied by transformers 5) +
        # encoder 12 * 7_079_424 blocks (q, k, v, o 4 * 768^2, wi_0, wi_1, wo 3 * 768 * 2048, two
        # layer norms 2 * 768) + relative_attention_bias 32 * 12 + final_layer_norm 768 = 84_954_240 +
        # decoder 12 * 9_439_488 blocks (cross-attention 4 * 768^2 and its norm 768 more) + 384 + 768
        # = 113_275_008; the header's 247_577_856 (the published figure) with lm_head.weight 24_674_304
        ("flan-t5-base", {"language": 222_903_552}),
        # Flan-T5-large: 32128 x 1024 = 32_899_072 + encoder 24 * 12_847_104 (4 * 1024^2 + 3 * 1024 * 2816
        # + 2 * 1024) + 512 + 1024 + decoder 24 * 17_042_432 + 512 + 1024; header 783_150_080 with lm_head
        ("flan-t5-large", {"language": 750_251_008}),
        # Flan-T5-xl: 32128 x 2048 = 65_798_144 + encoder 24 * 48_238_592 (4 * 2048^2 + 3 * 2048 * 5120
        # + 2 * 2048) + 1024 + 2048 + decoder 24 * 65_017_856 + 1024 + 2048; header 2_849_757_184 with lm_head
        ("flan-t5-xl", {"language": 2_783_959_040}),
        # T5-base (v1.0, relu: wi, wo 2 * 768 * 3072 = flan-t5-base's three 768 x 2048), no lm_head in the header
        ("t5-base", {"language": 222_903_552}),
        # StarCoder2-3B (starcoder2): 30 * 95_979_008 layers (q and o 2 * (3072^2 + 3072), k and v
        # 2 * (3072 * 256 + 256) for 2 key-value heads of 128, c_fc 12288 x 3072 + 12288, c_proj
        # 3072 x 12288 + 3072, two LayerNorms 4 * 3072) + the tied 49152 x 3072 table 150_994_944
        # + final LayerNorm 6144: the published 3.03B
        ("starcoder2-3b", {"language": 3_030_371_328}),
        # OPT-1.3B (opt): 24 * 50_358_272 layers (q, k, v, out_proj 4 * (2048^2 + 2048), fc1 8192 x 2048
        # + 8192, fc2 2048 x 8192 + 2048, two LayerNorms 4 * 2048) + the tied 50272 x 2048 table
        # 102_957_056 + the position table (2048 + 2) x 2048 = 4_198_400 + final LayerNorm 4096: the published 1.3B
        ("opt-1.3b", {"language": 1_315_758_080}),
        # OPT-6.7B: 32 * 201_379_840 layers (4 * (4096^2 + 4096), fc1 16384 x 4096 + 16384, fc2 4096 x 16384
        # + 4096, LayerNorms 4 * 4096) + 50272 x 4096 = 205_914_112 + 2050 x 4096 = 8_396_800 + 8192
        ("opt-6.7b", {"language": 6_658_473_984}),
        # blip2-opt-2.7b (blip_2): EVA ViT-g/14 at 224 (patch conv 829_312, class and positions 363_264,
        # 39 * 25_250_176 layers, post-LN 2816); Q-Former query_tokens 24_576 + LayerNorm 1536 + 6 * 10_434_816
        # (with cross-attention) + 6 * 7_087_872; language_projection 768 * 2560 + 2560; OPT-2.7B with vocab
        # 50304 (128_778_240 + 5_248_000 + 32 * 78_676_480 + 5120); the header's own lm_head copy left out
        ("blip2-opt-2.7b", {"vision": 985_952_256, "qformer": 105_162_240, "projector": 1_968_640, "language": 2_651_678_720}),
        # StableLM-2-1.6B (stablelm): 24 * 51_394_560 layers (q, k, v 3 * (2048^2 + 2048), o_proj
        # 2048^2 without bias, gate, up, down 3 * 2048 * 5632, two LayerNorms 4 * 2048) +
        # embed_tokens and lm_head 2 * 100352 * 2048 = 411_041_792 + final LayerNorm 4096: the published 1.64B
        ("stablelm-2-1_6b", {"language": 1_644_515_328}),
        # Granite-3.0-2B (granite, Llama's layers): 40 * 60_821_504 layers (q, o 2 * 2048^2, k, v
        # 2 * 2048 * 512 for 8 key-value heads of 64, gate, up, down 3 * 2048 * 8192, norms 2 * 2048)
        # + the tied 49155 x 2048 table 100_669_440 + norm 2048: the published 2.5B
        ("granite-3.0-2b-base", {"language": 2_533_531_648}),
        # Aya-Expanse-8B (cohere): 32 * 218_107_904 layers (q, o 2 * 4096^2, k, v 2 * 4096 * 1024,
        # gate, up, down 3 * 4096 * 14336, one LayerNorm without bias 4096) + the tied 256000 x 4096
        # table 1_048_576_000 + final LayerNorm 4096: the published 8.03B
        ("aya-expanse-8b", {"language": 8_028_033_024}),
        # Command R7B (cohere2): Aya-Expanse-8B's sizes and tensors, 8_028_033_024 (the published 8.03B)
        ("c4ai-command-r7b-12-2024", {"language": 8_028_033_024}),
        # aya-vision-8b (aya_vision): SigLIP so400m/14 at 364 without head (patch conv 3 * 14 * 14 * 1152
        # + 1152 = 678_528, positions 676 * 1152 = 778_752, 27 * 15_239_504 layers, post-LN 2304); projector
        # LayerNorm 2 * 4608 + linear_1 4608 * 28672 + 28672 + linear_2 14336 * 4096 + 4096; Command R7B's
        # language model (8_028_033_024, head tied): 8_631_842_032 in all, the published 8.63B
        ("aya-vision-8b", {"vision": 412_926_192, "projector": 190_882_816, "language": 8_028_033_024}),
        # command-a-vision-07-2025 (cohere2_vision): SigLIP so400m/16 at 512 without head (patch conv
        # 3 * 16 * 16 * 1152 + 1152 = 885_888, positions 1024 * 1152 = 1_179_648, 27 * 15_239_504 layers,
        # post-LN 2304); projector without LayerNorm: linear_1 4608 * 36864 + 36864 + linear_2
        # 18432 * 12288 + 12288; Command A's language model: the tied table 256000 * 12288 +
        # 64 * 1_686_122_496 layers (LN 12288, q and o 2 * 12288^2, k and v 2 * 1024 * 12288, MLP
        # 3 * 12288 * 36864) + norm 12288: 111_867_525_360 in all, the published 112B
        ("command-a-vision-07-2025", {"vision": 413_534_448, "projector": 396_410_880, "language": 111_057_580_032}),
        # Ovis2-2B-hf (ovis2): AIMv2-large/14 at 448 (patch conv 3 * 14 * 14 * 1024 + 1024 = 603_136, RMSNorm
        # 1024, positions 1024 * 1024, 24 * 12_847_104 layers (q, k, v, out 4 * 1024^2, gate, up, down
        # 3 * 1024 * 2816, 2 RMSNorms), final RMSNorm 1024: 309_984_256, AIMv2-large-patch14-448's published
        # count); visual tokenizer head_linear 4096 * 65531 + head_norm 2 * 65531 + table 65536 * 1536;
        # Qwen2.5-1.5B (tied: 151936 * 1536 + 28 * 46_797_824 + 1536): 2_222_907_894 in all, the published 2.22B
        ("Ovis2-2B-hf", {"vision": 309_984_256, "projector": 369_209_334, "language": 1_543_714_304}),
        # Ovis2-1B-hf: the same tower and head, a 65536 x 896 table; Qwen2.5-0.5B (tied: 151936 * 896 +
        # 24 * 14_912_384 + 896): 1_131_283_318 in all, the published 1.13B
        ("Ovis2-1B-hf", {"vision": 309_984_256, "projector": 327_266_294, "language": 494_032_768}),
        # idefics2-8b-base (idefics2): SigLIP so400m/14 at 980 without head (patch conv 678_528, positions
        # 4900 * 1152 = 5_644_800, 27 * 15_239_504 layers, post-LN 2304); connector: SwiGLU modality projection
        # 2 * 1152 * 14336 + 14336 * 4096, latents 64 * 4096, 3 resampler layers of 217_067_520 (3 norms, q, o
        # 2 * 4096 * 1536, k, v 2 * 4096 * 384, MLP 3 * 4096 * 16384), norm 4096; Mistral-7B with 32003 tokens,
        # untied (2 * 32003 * 4096 + 32 * 218_112_000 + 4096): 8_402_768_112 in all, the published 8.4B
        ("idefics2-8b-base", {"vision": 417_792_240, "projector": 743_219_200, "language": 7_241_756_672}),
        # InternLM2.5-7B-chat: 32 * 218_112_000 layers (wqkv (32 + 2 * 8) * 128 x 4096 = 25_165_824,
        # wo 4096^2, w1, w3, w2 3 * 4096 * 14336, attention_norm, ffn_norm 2 * 4096) + tok_embeddings
        # and output 2 * 92544 * 4096 = 758_120_448 + norm 4096 = 7_737_708_544, the published 7.74B
        ("internlm2_5-7b-chat", {"language": 7_737_708_544}),
        # InternLM-XComposer2-VL-7B (internlm_xcomposer2, remote code): the language model is
        # InternLM2.5-7B's 7_737_708_544 + 32 layers of Plora pairs, rank 256, [256, d_in] and
        # [d_out, 256] on wqkv 256 * (4096 + 6144), wo 256 * (4096 + 4096), w1, w3, w2 3 * 256 * (4096
        # + 14336): 32 * 18_874_368 = 603_979_776; the tower CLIP ViT-L/14 with 1226 positions: class
        # 1024 + patch 1024 * 3 * 14 * 14 = 602_112 + position 1226 * 1024 = 1_255_424 + pre / post
        # layernorm 2 * 2048 + 24 * 12_596_224 layers = 304_172_032; vision_proj 1024 * 4096 + 4096
        # + 4096^2 + 4096 = 20_979_712: 8_666_840_064 in all, the published 8.6B (8.67B)
        ("internlm-xcomposer2-vl-7b", {"vision": 304_172_032, "projector": 20_979_712, "language": 8_341_688_320}),
        # InternLM-XComposer2-4KHD-7B (internlm_xcomposer2_4khd, remote code, reconstructed config):
        # XComposer2-VL's language model 8_341_688_320 (Plora pairs included); the tower CLIP
        # ViT-L/14-336 at its own 577 positions: 304_172_032 - (1226 - 577) * 1024 = 303_507_456 (Phi-3-vision's);
        # vision_proj from the 2 x 2 merged 4 * 1024: 4096 * 4096 + 4096 + 4096^2 + 4096 = 33_562_624
        # + plora_glb_GN, plora_sub_GN 2 * 4096 = 33_570_816: 8_678_766_592 in all (the published 8.7B)
        ("internlm-xcomposer2-4khd-7b", {"vision": 303_507_456, "projector": 33_570_816, "language": 8_341_688_320}),
        # Qwen-7B (qwen, remote code): 32 * 202_395_648 layers (c_attn 3 * 4096 = 12288 x 4096
        # + 12288 = 50_343_936, attn.c_proj 4096^2, w1, w2 (22016 // 2 = 11008 rows each) and
        # mlp.c_proj 3 * 4096 * 11008, ln_1, ln_2 2 * 4096) + wte and lm_head 2 * 151936 * 4096
        # = 1_244_659_712 + ln_f 4096 = 7_721_324_544, the hub's count (index total_size 15_442_649_088 B in bf16)
        ("Qwen-7B", {"language": 7_721_324_544}),
        # Qwen-1_8B: 24 * 50_604_032 layers (c_attn 6144 x 2048 + 6144 = 12_589_056, attn.c_proj
        # 2048^2, w1, w2 (11008 // 2 = 5504 rows each) and mlp.c_proj 3 * 2048 * 5504, ln_1, ln_2
        # 2 * 2048) + wte and lm_head 2 * 151936 * 2048 = 622_329_856 + ln_f 2048 = 1_836_828_672, the published 1.8B
        ("Qwen-1_8B", {"language": 1_836_828_672}),
        # Baichuan2-7B-Base (baichuan, remote code): 32 * 202_383_360 layers (W_pack 3 * 4096 x 4096
        # = 50_331_648, o_proj 4096^2, gate, up, down 3 * 4096 * 11008 = 135_266_304, input_layernorm,
        # post_attention_layernorm 2 * 4096) + embed_tokens and lm_head 2 * 125696 * 4096 = 1_029_701_632
        # + norm 4096 = 7_505_973_248, the published 7.5B (no rotary buffer: inv_freq is a plain attribute)
        ("Baichuan2-7B-Base", {"language": 7_505_973_248}),
        # Qwen-VL-Chat (qwen_vl, remote code): the language model is Qwen-7B's 7_721_324_544; the
        # tower conv1 1664 * 3 * 14 * 14 = 978_432 + positional_embedding 256 * 1664 = 425_984 + ln_pre
        # 3328 + 48 * 38_361_728 blocks (ln_1, ln_2 2 * 3328, in_proj 4992 x 1664 + 4992 = 8_311_680,
        # out_proj 1664^2 + 1664 = 2_770_560, c_fc int(1664 * 4.9231) = 8192 rows: 8192 x 1664 + 8192
        # = 13_639_680, c_proj 1664 x 8192 + 1664 = 13_633_152) = 1_842_770_688; attn_pool query and
        # pos_embed 2 * 256 * 4096 + kv_proj 4096 x 1664 = 6_815_744 + in_proj 3 * 4096^2 + 12288
        # + out_proj 4096^2 + 4096 + ln_q, ln_kv 2 * 8192 = 76_054_528, ln_post 8192, proj 4096^2:
        # 92_839_936; 9_656_935_168 in all, the published 9.6B
        ("Qwen-VL-Chat", {"vision": 1_842_770_688, "projector": 92_839_936, "language": 7_721_324_544}),
        # Phi-3-vision-128k-instruct (phi3_v, remote code): the CLIP ViT-L/14-336 under
        # model.vision_embed_tokens.img_processor. (patch 602_112 + class / positions 591_872 + pre-LN
        # 2048 + 24 * 12_596_224 + post-LN 2048 = 303_507_456); glb_GN and sub_GN 2 * 4096 and
        # img_projection 4096 x 3072 + 3072 + 3072^2 + 3072 (22_034_432); Phi-3-mini with vocab 32064:
        # 32 * 113_252_352 layers (qkv_proj 9216 x 3072, o_proj 3072^2, gate_up_proj 16384 x 3072,
        # down_proj 3072 x 8192, two norms 2 * 3072) + embed_tokens and lm_head 2 * 32064 * 3072
        # = 197_001_216 + norm 3072 = 3_821_079_552; 4_146_621_440 in all, the published 4.15B
        # Yi-VL-6B-hf (yi_vl, reconstructed config): the LAION CLIP ViT-H/14 at 448 px, patch 1280 * 3 * 14
        # * 14 = 752_640 (no bias) + class 1280 + positions (448 / 14)^2 + 1 = 1025 rows * 1280 =
        # 1_312_000 + pre-LN 2560 + 32 * 19_677_440 layers (q, k, v, out 4 * (1280^2 + 1280) =
        # 6_558_720, fc1 5120 x 1280 + 5120, fc2 1280 x 5120 + 1280 = 13_113_600, two LayerNorms 5120)
        # + post-LN 2560 = 631_749_120; the projector linear_1 4096 x 1280 + 4096 = 5_246_976, LayerNorm
        # linear_2 2 * 4096, linear_3 4096^2 + 4096 = 16_781_312, LayerNorm linear_4 2 * 4096:
        # 22_044_672; Yi-6B: 32 * 173_023_232 layers (q, o 2 * 4096^2, k, v 2 * 512 x 4096 (GQA 32 / 4),
        # MLP 3 * 4096 * 11008 = 135_266_304, norms 2 * 4096) + embed_tokens and lm_head
        # 2 * 64064 * 4096 = 524_812_288 + norm 4096 = 6_061_559_808; 6_715_353_600 in all
        ("Yi-VL-6B-hf", {"vision": 631_749_120, "projector": 22_044_672, "language": 6_061_559_808}),
        # Yi-VL-34B-hf: the same tower; the projector 7168 x 1280 + 7168 = 9_182_208, 2 * 7168, 7168^2 +
        # 7168 = 51_387_392, 2 * 7168: 60_598_272; Yi-34B: 60 * 557_856_768 layers (q, o 2 * 7168^2, k, v
        # 2 * 1024 x 7168 (GQA 56 / 8), MLP 3 * 7168 * 20480 = 440_401_920, norms 2 * 7168) +
        # 2 * 64064 * 7168 = 918_421_504 + norm 7168 = 34_389_834_752; 35_082_182_144 in all
        ("Yi-VL-34B-hf", {"vision": 631_749_120, "projector": 60_598_272, "language": 34_389_834_752}),
        ("Phi-3-vision-128k-instruct", {"vision": 303_507_456, "projector": 22_034_432, "language": 3_821_079_552}),
        # Phi-3.5-vision-instruct: the same layout and sizes, 4_146_621_440, the published 4.15B
        ("Phi-3.5-vision-instruct", {"vision": 303_507_456, "projector": 22_034_432, "language": 3_821_079_552}),
        # MiniCPM-V-2_6 (minicpmv, remote code): the tower is the patch conv 1152 x 3 x 14 x 14 + 1152
        # = 678_528, the position table 4900 * 1152 = 5_644_800 (980 / 14 = 70 per side), 27 *
        # 15_239_504 SigLIP layers, post-LN 2304 = 417_792_240; the resampler query 64 * 3584 = 229_376,
        # kv_proj 3584 x 1152 = 4_128_768, in_proj 3 * 3584^2 + 3 * 3584 = 38_545_920, out_proj 3584^2
        # + 3584 = 12_848_640, ln_q, ln_kv, ln_post 6 * 3584, proj 3584^2 = 12_845_056: 68_619_264 (the
        # 70 x 70 sin-cos pos_embed is a non-persistent buffer); the Qwen2 language model 28 *
        # 233_057_792 layers (q 3584^2 + 3584, k, v 512 x 3584 + 512, o 3584^2, MLP 3 * 3584 * 18944,
        # two norms) + embed_tokens and lm_head 2 * 151666 * 3584 = 1_087_141_888 + norm 3584 =
        # 7_612_763_648; 8,099,175,152 in all, the published 8.1B
        ("MiniCPM-V-2_6", {"vision": 417_792_240, "projector": 68_619_264, "language": 7_612_763_648}),
        # Mixtral-8x7B: 32 * 1_451_270_144 layers (attention as Mistral's 41_943_040; router 8 x 4096
        # = 32_768; 8 experts x 3 x 4096 x 14336 = 1_409_286_144; norms 2 * 4096)
        # + 2 * 131_072_000 (vocab 32000) + norm 4096 = 46_702_792_704, the published 46.7B
        ("Mixtral-8x7B-v0.1", {"language": 46_702_792_704}),
        # Qwen3-30B-A3B: 48 * 623_120_640 layers (q, o 4096 x 2048, k, v 512 x 2048: 18_874_368;
        # q_norm, k_norm 128 each; router 128 x 2048 = 262_144; 128 experts x 3 x 2048 x 768
        # = 603_979_776; norms 2 * 2048) + 2 * 311_164_928 (vocab 151936) + norm 2048
        ("Qwen3-30B-A3B", {"language": 30_532_122_624}),
        # Qwen1.5-MoE-A2.7B: 24 * 570_560_512 layers (q, k, v 2048^2 + 2048 each, o 2048^2: 16_783_360;
        # router 60 x 2048 = 122_880; 60 experts x 3 x 2048 x 1408 = 519_045_120; shared expert
        # 3 * 2048 * 5632 = 34_603_008 and its gate 1 x 2048; norms 2 * 2048) + 2 * 311_164_928
        # (vocab 151936) + norm 2048 = 14_315_784_192, the published 14.3B
        ("Qwen1.5-MoE-A2.7B", {"language": 14_315_784_192}),
        # Qwen2-57B-A14B: 28 * 2_011_413_504 layers (q 3584^2 + 3584, k, v 512 x 3584 + 512 each,
        # o 3584^2: 29_364_736; router 64 x 3584 = 229_376; 64 experts x 3 x 3584 x 2560
        # = 1_761_607_680; shared expert 3 * 3584 * 20480 = 220_200_960 and its gate 1 x 3584;
        # norms 2 * 3584) + 2 * 544_538_624 (vocab 151936) + norm 3584 = 57_408_658_944, the published 57.4B
        ("Qwen2-57B-A14B", {"language": 57_408_658_944}),
        # DeepSeek-V2-Lite: 27 attentions and norms 27 * 13_767_168 (q_proj 16 * 192 x 2048 = 6_291_456,
        # kv_a_proj_with_mqa (512 + 64) x 2048 = 1_179_648, kv_a_layernorm 512, kv_b_proj
        # 16 * (128 + 128) x 512 = 2_097_152, o_proj 2048 x 16 * 128 = 4_194_304; norms 2 * 2048),
        # layer 0's dense MLP 3 * 2048 * 10944 = 67_239_936, 26 MoE blocks 26 * 571_080_704 (router
        # 64 x 2048 = 131_072, 64 experts x 3 x 2048 x 1408 = 553_648_128, shared experts
        # 3 * 2048 * 2816 = 17_301_504) + 2 * 209_715_200 (vocab 102400) + norm 2048, the published 15.7B
        ("DeepSeek-V2-Lite", {"language": 15_706_484_224}),
        # DeepSeek-V2: 60 attentions and norms 60 * 149_237_760 (q_a_proj 1536 x 5120 = 7_864_320,
        # q_a_layernorm 1536, q_b_proj 128 * 192 x 1536 = 37_748_736, kv_a_proj_with_mqa 576 x 5120
        # = 2_949_120, kv_a_layernorm 512, kv_b_proj 128 * 256 x 512 = 16_777_216, o_proj 5120 x 16384
        # = 83_886_080; norms 2 * 5120), layer 0's dense MLP 3 * 5120 * 12288 = 188_743_680, 59 MoE
        # blocks 59 * 3_822_878_720 (router 160 x 5120 = 819_200, 160 experts x 3 x 5120 x 1536
        # = 3_774_873_600, shared experts 3 * 5120 * 3072 = 47_185_920) + 2 * 524_288_000 + norm 5120,
        # the published 236B
        ("DeepSeek-V2", {"language": 235_741_434_880}),
        # Moonlight-16B-A3B (deepseek_v3): DeepSeek-V2-Lite's attention and MoE blocks (27 * 13_767_168,
        # 26 * 571_080_704), layer 0's dense MLP 3 * 2048 * 11264 = 69_206_016, embeddings and head
        # 2 * 163840 x 2048 = 671_088_640, norm 2048; the routers' e_score_correction_bias is a buffer
        ("Moonlight-16B-A3B", {"language": 15_960_108_544}),
        # LLaVA-NeXT: LLaVA-1.5's CLIP and projector, plus image_newline [4096] in the projector
        # (20_979_712 + 4096); Vicuna-7B with vocab 32064 as in llava-1.5-7b-hf
        ("llava-v1.6-vicuna-7b-hf", {"vision": 303_507_456, "projector": 20_983_808, "language": 6_738_939_904}),
        # Mistral-7B's 7_241_732_096 with vocab 32064: + 2 * 64 * 4096 = 524_288
        ("llava-v1.6-mistral-7b-hf", {"vision": 303_507_456, "projector": 20_983_808, "language": 7_242_256_384}),
        # LLaVA-OneVision: SigLIP so400m/14 at 384 without its last layer, 26 * 15_239_504 layers
        # + patch 3 * 14 * 14 * 1152 + 1152 = 678_528 + positions 729 * 1152 = 839_808 + post-LN
        # 2304; projector 1152 x h + h + h x h + h, plus image_newline [h]; Qwen2 with q, k, v biases
        # 0.5B: projector 1_032_192 + 896 + 802_816 + 896 + 896; Qwen2-0.5B 24 * 14_912_384 layers
        # (q, o 896^2, k, v 128 x 896, biases 896 + 2 * 128, MLP 3 * 896 * 4864, norms 2 * 896)
        # + one tied 136_192_000 table (vocab 152000: Qwen2's 151936 + 3 tokens, padded to 64)
        # + norm 896 = 494_090_112; 893_675_552 in all, the published 894M
        ("llava-onevision-qwen2-0.5b-ov-hf", {"vision": 397_747_744, "projector": 1_837_696, "language": 494_090_112}),
        # 7B: projector 4_128_768 + 3584 + 12_845_056 + 3584 + 3584; Qwen2-7B 28 * 233_057_792
        # layers (q, o 3584^2, k, v 512 x 3584, biases 3584 + 2 * 512, MLP 3 * 3584 * 18944,
        # norms 2 * 3584) + 2 * 545_226_752 (vocab 152128: 152064 + 3, padded to 64) + norm 3584
        # = 7_616_075_264; 8_030_807_584 in all, the published 8.03B
        ("llava-onevision-qwen2-7b-ov-hf", {"vision": 397_747_744, "projector": 16_984_576, "language": 7_616_075_264}),
        # LLaVA-NeXT-Video-7B: llava-v1.6-vicuna-7b's modules (the average-pooling resampler has no
        # weights); 7_063_431_168 in all, the published 7.06B
        ("LLaVA-NeXT-Video-7B-hf", {"vision": 303_507_456, "projector": 20_983_808, "language": 6_738_939_904}),
        # Gemma-2-2B: 26 * 77_865_984 layers (q, o 2304 x 2048, k, v 2304 x 1024, MLP
        # 3 * 2304 * 9216, four norms 4 * 2304) + one tied 589_824_000 table (256000 x 2304) + norm 2304
        ("gemma-2-2b", {"language": 2_614_341_888}),
        # Gemma-2-9B: 42 * 198_195_200 layers (q, o 3584 x 4096, k, v 3584 x 2048, MLP
        # 3 * 3584 * 14336, four norms 4 * 3584) + one tied 917_504_000 table (256000 x 3584) + norm 3584
        ("gemma-2-9b", {"language": 9_241_705_984}),
        # Gemma-3-1B: 26 * 26_842_112 layers (q, o 1152 x 1024, k, v 1152 x 256, q_norm and k_norm
        # 256 each, MLP 3 * 1152 * 6912, four norms 4 * 1152) + one tied 301_989_888 table
        # (262144 x 1152) + norm 1152
        ("gemma-3-1b-pt", {"language": 999_885_952}),
        # Gemma-2B (Gemma 1): 18 * 110_104_576 layers (q, o 2048^2, MQA k, v 2048 x 256, MLP
        # 3 * 2048 * 16384, two norms 2 * 2048) + one tied 524_288_000 table (256000 x 2048) + norm 2048
        ("gemma-2b", {"language": 2_506_172_416}),
        # PaliGemma-3B-224: SigLIP so400m/14 at 224 (patch conv 3 * 14 * 14 * 1152 + 1152 = 678_528,
        # positions 256 * 1152 = 294_912, 27 * 15_239_504 layers, post-LN 2304), projector
        # 1152 * 2048 + 2048, Gemma-2B with vocab 257216 (18 * 110_104_576 + tied 526_778_368 + 2048)
        ("paligemma-3b-pt-224", {"vision": 412_442_352, "projector": 2_361_344, "language": 2_508_662_784}),
        # PaliGemma2-3B-448: the same tower with 1024 positions (+ 768 * 1152), projector
        # 1152 * 2304 + 2304, Gemma-2-2B with vocab 257216 (26 * 77_865_984 + tied 592_625_664 + 2304)
        ("paligemma2-3b-pt-448", {"vision": 413_327_088, "projector": 2_656_512, "language": 2_617_143_552}),
        # PaliGemma2-3B-896: the 448 checkpoint with 4096 positions (+ 3072 * 1152 = 3_538_944)
        ("paligemma2-3b-pt-896", {"vision": 416_866_032, "projector": 2_656_512, "language": 2_617_143_552}),
        # Gemma-3-4B-it: SigLIP so400m/14 at 896 (patch conv 678_528, positions 4096 * 1152 =
        # 4_718_592, 27 * 15_239_504 layers, post-LN 2304), projector 1152 * 2560 + norm 1152,
        # Gemma 3 text: 34 * 94_382_592 layers (q, o 2560 x 2048, k, v 2560 x 1024, q_norm and
        # k_norm 256 each, MLP 3 * 2560 * 10240, four norms 4 * 2560) + one tied 671_252_480
        # table (262208 x 2560) + norm 2560; 4_300_079_472 in all, the published count
        ("gemma-3-4b-it", {"vision": 416_866_032, "projector": 2_950_272, "language": 3_880_263_168}),
        # Gemma-3-12B-it: the same tower, projector 1152 * 3840 + 1152, 48 * 224_148_992 layers
        # (q, o 3840 x 4096, k, v 3840 x 2048, MLP 3 * 3840 * 15360, norms 4 * 3840 + 2 * 256) +
        # tied 1_006_878_720 (262208 x 3840) + norm 3840; 12_187_325_040 in all, the published count
        ("gemma-3-12b-it", {"vision": 416_866_032, "projector": 4_424_832, "language": 11_766_034_176}),
        # Gemma-3-27B-it: the same tower, projector 1152 * 5376 + 1152, 62 * 412_898_560 layers
        # (q, o 5376 x 4096, k, v 5376 x 2048 (head_dim 128), MLP 3 * 5376 * 21504, norms 4 * 5376 +
        # 2 * 128) + tied 1_409_630_208 (262208 x 5376) + norm 5376; 27_432_406_640 in all, the published 27.4B
        ("gemma-3-27b-it", {"vision": 416_866_032, "projector": 6_194_304, "language": 27_009_346_304}),
        # SmolVLM-Instruct (idefics3): SigLIP so400m/14 at 384 (patch conv 678_528, positions
        # 729 * 1152 = 839_808, 27 * 15_239_504 layers, post-LN 2304), connector (pixel shuffle
        # 3 x 3: 1152 * 9 = 10_368 inputs) 10_368 * 2048, no bias, SmolLM2-1.7B with vocab 49155
        # (24 * 67_112_960 layers + embeddings and an untied lm_head 2 * 100_669_440 + norm 2048)
        ("SmolVLM-Instruct", {"vision": 412_987_248, "projector": 21_233_664, "language": 1_812_051_968}),
        # Idefics3-8B-Llama3: the tower at 364 (676 * 1152 = 778_752 positions), connector 2 x 2:
        # 4608 * 4096, Llama-3.1-8B with vocab 128259 (8_030_261_248 + 2 * 3 * 4096)
        ("Idefics3-8B-Llama3", {"vision": 412_926_192, "projector": 18_874_368, "language": 8_030_285_824}),
        # SmolVLM2-500M (smolvlm): SigLIP base/16 at 512 (patch conv 3 * 16 * 16 * 768 + 768 = 590_592,
        # positions 1024 * 768 = 786_432, 12 * 7_087_872 layers, post-LN 1536), connector (pixel
        # shuffle 4 x 4: 768 * 16 = 12_288 inputs) 12_288 * 960, SmolLM2-360M with vocab 49280
        # (32 * 9_832_320 layers: q, o 960^2, k, v 320 x 960, MLP 3 * 960 * 2560, two norms;
        # untied embeddings and lm_head 2 * 47_308_800; norm 960)
        ("SmolVLM2-500M-Video-Instruct", {"vision": 86_433_024, "projector": 11_796_480, "language": 409_252_800}),
        # SmolVLM2-2.2B-Instruct (smolvlm): SmolVLM-Instruct's tower and connector; SmolLM2-1.7B with
        # SmolVLM2's vocab 49280 (24 * 67_112_960 layers + untied embeddings and lm_head
        # 2 * 100_925_440 (49280 x 2048) + norm 2048): 2,246,784,880 in all
        ("SmolVLM2-2.2B-Instruct", {"vision": 412_987_248, "projector": 21_233_664, "language": 1_812_563_968}),
        # DeepSeek-VL-1.3B-chat (deepseek_vl): SigLIP-L/16 at 384 (patch conv 3 * 16 * 16 * 1024 + 1024
        # = 787_456, positions 576 * 1024 = 589_824, 24 * 12_596_224 layers, post-LN 2048, and the
        # attention-pooling head 12_595_200: probe 1024, in_proj 3 * 1024^2 + 3072, out_proj
        # 1024^2 + 1024, LN 2048, MLP 2 * 1024 * 4096 + 4096 + 1024), aligner 1024 * 2048 + 2048
        # + 2048^2 + 2048, DeepSeek-LLM-1.3B with vocab 102400 (24 * 51_384_320 layers: q, k, v, o
        # 2048^2, MLP 3 * 2048 * 5632, two norms; untied embeddings and lm_head 2 * 209_715_200;
        # norm 2048): 1,975,235,584 in all
        ("deepseek-vl-1.3b-chat", {"vision": 316_283_904, "projector": 6_295_552, "language": 1_652_656_128}),
        # Mistral-Small-3.1-24B-Instruct-2503 (mistral3): Pixtral tower (patch conv 3 * 14 * 14 * 1024
        # = 602_112, ln_pre 1024, 24 * 16_779_264 layers: q, k, v, o 1024^2, SwiGLU 3 * 1024 * 4096,
        # two norms), projector (norm 1024, merging_layer 4096 * 1024, linear_1 1024 * 5120, linear_2
        # 5120^2, no biases), Mistral-Small-24B with vocab 131072 (40 * 555_755_520 layers: q 5120 *
        # 4096, k, v 5120 * 1024, o 4096 * 5120, MLP 3 * 5120 * 32768, two norms; untied embeddings
        # and lm_head 2 * 671_088_640; norm 5120): 24,011,361,280 in all
        ("Mistral-Small-3.1-24B-Instruct-2503", {"vision": 403_305_472, "projector": 35_652_608, "language": 23_572_403_200}),
        # Pixtral-12B (mistral-community/pixtral-12b, llava with a Pixtral tower: llava_pixtral):
        # the tower with patch 16 (patch conv 3 * 16 * 16 * 1024 = 786_432, ln_pre 1024,
        # 24 * 16_779_264 layers), projector linear_1 1024 * 5120 + 5120 = 5_248_000 and linear_2
        # 5120^2 + 5120 = 26_219_520 (LLaVA's, with biases), Mistral-Nemo-12B with vocab 131072
        # (40 * 272_640_000 layers: q 5120 * 4096, k, v 5120 * 1024, o 4096 * 5120, MLP
        # 3 * 5120 * 14336, two norms; untied embeddings and lm_head 2 * 671_088_640; norm 5120):
        # 12,682,739,712 in all, the published 12.7B
        ("pixtral-12b", {"vision": 403_489_792, "projector": 31_467_520, "language": 12_247_782_400}),
        # Qwen3-VL-2B (qwen3_vl): the tower is the patch conv 1024 x 3 x 2 x 16 x 16 = 1_572_864 and
        # its bias 1024, the position table 2304 * 1024 = 2_359_296 and 24 * 12_596_224 blocks
        # (LayerNorms 4 * 1024, qkv 3072 x 1024 + 3072, proj 1024^2 + 1024, linear_fc1 4096 x 1024
        # + 4096, linear_fc2 1024 x 4096 + 1024); the projector the merger 25_174_016 (LayerNorm
        # 2 * 1024, linear_fc1 4096^2 + 4096, linear_fc2 2048 x 4096 + 2048) and 3 DeepStack
        # mergers 25_180_160 (their LayerNorm over 4096); Qwen3-1.7B-sized text: 28 * 50_336_000
        # layers (q, o 2048^2, k, v 1024 x 2048, q_norm, k_norm 128 each, MLP 3 * 2048 * 6144,
        # norms 2 * 2048) + the tied table 151936 * 2048 = 311_164_928 + norm 2048;
        # 2_127_532_032 in all, the published 2.13B
        ("Qwen3-VL-2B-Instruct", {"vision": 306_242_560, "projector": 100_714_496, "language": 1_720_574_976}),
        # Qwen3-VL-8B: the patch conv 1152 x 1536 = 1_769_472 + 1152, positions 2304 * 1152
        # = 2_654_208, 27 * 15_239_504 blocks (width 1152, MLP 4304: SigLIP so400m's layer size);
        # the merger 40_119_040 (width 4 * 1152 = 4608 to 4096) and 3 DeepStack mergers
        # 40_125_952; the text 36 * 192_946_432 layers (q, o 4096^2, k, v 1024 x 4096, MLP
        # 3 * 4096 * 12288, norms) + untied embeddings and lm_head 2 * 622_329_856 + norm 4096;
        # 8_767_123_696 in all, the published 8.77B
        ("Qwen3-VL-8B-Instruct", {"vision": 415_891_440, "projector": 160_496_896, "language": 8_190_735_360}),
        # GLM-4.1V-9B-Thinking (glm4v; config.json reconstructed, see tests/hubfixtures.py): the tower
        # is the patch conv 1536 x 3 x 2 x 14 x 14 = 1_806_336 and its bias 1536, post_conv_layernorm
        # 1536, the position table 576 * 1536 = 884_736, 24 * 28_314_624 blocks (norms 2 * 1536, qkv
        # 4608 x 1536 and proj 1536^2 without bias, SwiGLU of out_hidden_size 3 * 1536 * 4096),
        # post_layernorm 1536, the downsample conv 4096 x 1536 x 2 x 2 + 4096 = 25_169_920; the
        # projector the merger 185_081_856 (proj 4096^2, LayerNorm 2 * 4096, gate / up 2 * 4096 *
        # 13696, down 13696 x 4096, no biases); GLM-4-0414-9B-sized text: 40 * 203_969_024 layers
        # (q 4096^2 + 4096, k, v 256 x 4096 + 256, o 4096^2, gate_up 27392 x 4096, down 4096 x 13696,
        # four norms) + untied embeddings and lm_head 2 * 620_756_992 + norm 4096;
        # 10_292_777_472 in all, the published 10.3B
        ("GLM-4.1V-9B-Thinking", {"vision": 707_416_576, "projector": 185_081_856, "language": 9_400_279_040}),
        # MiniCPM-V-4.6 (minicpmv4_6): the tower is the patch conv 1152 x 3 x 14 x 14 + 1152 = 678_528,
        # the position table 4900 * 1152 = 5_644_800 (980 / 14 = 70 per side), 27 * 15_239_504 SigLIP
        # layers, post-LN 2304 and the vit_merger 104_507_072 (q, k, v, out 4 * (1152^2 + 1152),
        # layer_norm1 2 * 1152, pre_norm 2 * 4608, linear_1 4608 x 17216 + 17216, linear_2 17216 x 1152
        # + 1152); the projector the merger 25_967_104 (pre_norm 2 * 4608, linear_1 4608^2 + 4608,
        # linear_2 1024 x 4608 + 1024); the Qwen3.5 text: 18 linear-attention layers of 21_555_360
        # (in_proj_qkv 6144 x 1024, in_proj_z 2048 x 1024, in_proj_b and in_proj_a 16 x 1024, conv1d
        # 6144 x 4, dt_bias and A_log 16 each, norm 128, out_proj 1024 x 2048, MLP 3 * 1024 * 3584, two
        # norms) + 6 full-attention layers of 18_352_640 (q 4096 x 1024, k, v 512 x 1024, o 1024 x 2048,
        # q_norm, k_norm 256 each, the MLP, two norms) + norm 1024 + the tied 248094 x 1024 table
        # 254_048_256; 1,300,428,016 in all, the hub's safetensors count
        ("MiniCPM-V-4.6", {"vision": 522_299_312, "projector": 25_967_104, "language": 752_161_600}),
        # Llama-3.2-11B-Vision-Instruct (mllama): the tower is the patch conv 1280 x 3 x 14 x 14 =
        # 752_640, the class embedding 1280, the gated position table 1601 * 1280 = 2_049_280 and its
        # tile-position table 9 x (4 * 1601 * 1280) = 73_774_080, the pre- and post-tile tables
        # 2 * 9 * 4 * 1280 = 92_160, three gates, layernorm_pre / _post 4 * 1280, 32 local layers of
        # 19_672_320 (q, k, v, o 1280^2 without bias, fc1 5120 x 1280 + 5120, fc2 1280 x 5120 + 1280,
        # two LayerNorms 4 * 1280) and 8 gated global layers of 19_672_322; the projector 7680 x 4096
        # + 4096; the text: the token table (128256 + 8) x 4096 = 525_369_344, 32 self-attention
        # layers of 218_112_000 (q, o 4096^2, k, v 1024 x 4096, MLP 3 * 4096 * 14336, two norms),
        # 8 cross-attention layers of 218_112_258 (the same with q_norm, k_norm 128 each and two
        # gates), norm 4096 and lm_head 128256 x 4096 = 525_336_576; 10,670,220,835 in all, the
        # published count
        ("Llama-3.2-11B-Vision-Instruct", {"vision": 863_567_379, "projector": 31_461_376, "language": 9_775_192_080}),
        # Llama-3.2-90B-Vision-Instruct: the same tower, the projector 7680 x 8192 + 8192, the text:
        # the token table 128264 x 8192 = 1_050_738_688, 80 self-attention layers of 855_654_400
        # (q, o 8192^2, k, v 1024 x 8192, MLP 3 * 8192 * 28672, two norms), 20 cross-attention layers
        # of 855_654_658, norm 8192, lm_head 128256 x 8192 = 1_050_673_152; 88,593,355,323 in all,
        # the published 88.6B
        ("Llama-3.2-90B-Vision-Instruct", {"vision": 863_567_379, "projector": 62_922_752, "language": 87_666_865_192}),
    ],
)
def test_parameters_per_module_equal_the_header(fixture, modules):
    imported = importer.import_spec(str(FIX / fixture))
    assert imported.header_parameters == modules
    assert importer.formula_counts(imported.spec) == modules
    assert {m.name: m.parameters for m in imported.spec.modules} == modules


def test_total_parameters():
    assert sum(importer.import_spec(str(FIX / "llava-1.5-7b-hf")).header_parameters.values()) == 7_063_427_072


@pytest.mark.parametrize(
    "fixture, image_size, tiles",
    [
        # SmolVLM (size 1536, tile 384): the longest edge to 1536, the other side scaled
        ("SmolVLM-Instruct", None, 17),  # no size: square, 4 x 4 + the global tile
        ("SmolVLM-Instruct", [768, 1024], 13),  # 1152 x 1536: 3 x 4 + 1
        ("SmolVLM-Instruct", [640, 1536], 9),  # 640 x 1536: 2 x 4 + 1
        ("SmolVLM-Instruct", [2000, 300], 5),  # 1536 x 230 (int 230.4, even): 4 x 1 + 1
        # Idefics3-8B (size 1456, tile 364): 1000 x 700 -> 1456 x 1020 (1019.2 floored, made
        # even): rows ceil(1456 / 364) = 4, cols ceil(1020 / 364) = 3: 13
        ("Idefics3-8B-Llama3", [1000, 700], 13),
    ],
)
def test_tiles_per_image_follow_the_processor(fixture, image_size, tiles):
    """The vision tower's batch is the tiles: its pixel_values buffer is tiles x 3 x tile^2 x 2
    bytes (bf16), and the processor's pixel_attention_mask tiles x tile^2 x 8 (int64)."""
    spec = importer.import_spec(str(FIX / fixture)).spec
    side = 384 if fixture == "SmolVLM-Instruct" else 364
    setup = resolve_setup(None, spec, {"micro_batch": 2, "seq_len": 4096, **({"image_size": image_size} if image_size else {})})
    vision = next(row for row in api.run(spec, setup).rows if row.path == "vision")
    assert vision.buffers == 2 * tiles * side * side * (3 * 2 + 8)


def test_seq_len_must_hold_the_tiles_image_tokens():
    """768 x 1024 is 13 tiles of 81 tokens (1053): seq_len 1024 cannot hold them (E723), 1053 can."""
    spec = importer.import_spec(str(FIX / "SmolVLM-Instruct")).spec
    short = resolve_setup(None, spec, {"micro_batch": 1, "seq_len": 1024, "image_size": [768, 1024]})
    message = _error(api.run, spec, short)
    assert "E723" in message and "seq_len 1024 is shorter than the image tokens it must hold (1 x 1053 = 1053 at image size 768 x 1024)" in message
    api.run(spec, resolve_setup(None, spec, {"micro_batch": 1, "seq_len": 1053, "image_size": [768, 1024]}))


def test_gqa_and_tied_embeddings_reach_the_spec():
    llama3 = importer.import_spec(str(FIX / "Meta-Llama-3-8B")).data["modules"]["language"]["inputs"]
    assert (llama3["n_heads"], llama3["n_kv_heads"], llama3["head_dim"]) == (32, 8, 128)
    small = importer.import_spec(str(FIX / "Llama-3.2-1B"))
    assert small.data["modules"]["language"]["inputs"]["tie_embeddings"] is True
    assert small.data["image_tokens"] == 0
    assert small.data["modules"]["language"]["context"] == {"batch": "micro_batch", "seq": "seq_len"}


def test_buffers_are_set_aside_and_said_so():
    data = importer.import_spec(str(FIX / "Llama-2-7b-hf")).data
    assert "Left out of the counts as buffers, not parameters: model.layers.{0..31}.self_attn.rotary_emb.inv_freq x32 F32[64]." in data["notes"]


@pytest.mark.parametrize("fixture", ["Llama-3.2-1B", "Llama-2-7b-hf"])
def test_safetensors_reads_the_fixture_headers(fixture, tmp_path):
    from safetensors import safe_open

    for shard in sorted((FIX / fixture).glob("*.safetensors")):
        full = tmp_path / shard.name
        hf.sparse_copy(shard, full)  # the data section as a hole: the header's offsets must add up
        ours = {t.name: t.shape for t in hub.tensors_of(hub.read_header(shard, "x"), shard.name, "x")}
        with safe_open(str(full), framework="numpy") as f:
            assert sorted(f.keys()) == sorted(ours)
            name = next(iter(ours))
            assert tuple(f.get_slice(name).get_shape()) == ours[name]


# --------------------------------------------------------------------------- LLaVA against the hand-written spec


def _inputs_with_defaults(module) -> dict:
    formula = api.library()[module.type]
    out = {i.name: i.default for i in formula.inputs if i.has_default and i.type != "tensor"}
    out.update(module.inputs)
    return out


def test_llava_import_reproduces_the_hand_written_spec():
    ours = importer.import_spec(str(FIX / "llava-1.5-7b-hf")).spec
    theirs = api.load_spec("specs/llava/llava-1.5-7b.yaml")
    assert [m.name for m in ours.modules] == [m.name for m in theirs.modules]
    assert ours.image_tokens == theirs.image_tokens == 576
    for a, b in zip(ours.modules, theirs.modules):
        assert (a.type, a.parameters) == (b.type, b.parameters)
        assert _inputs_with_defaults(a) == _inputs_with_defaults(b)
        for knobs in ({"micro_batch": 3, "images_per_sample": 2, "seq_len": 2048}, {"micro_batch": 1, "images_per_sample": 1, "seq_len": 600}):
            scope = {**knobs, **a.inputs}
            assert (a.batch(scope), a.seq(scope)) == (b.batch({**knobs, **b.inputs}), b.seq({**knobs, **b.inputs}))


@pytest.mark.parametrize("experiment", ["llava-1.5-7b-finetune", "llava-1.5-7b-pretrain", "llava-1.5-7b-seed-s2048-b8-dp4"])
def test_llava_import_estimates_exactly_like_the_hand_written_spec(experiment):
    from compiler.pipeline.load import load_yaml
    from compiler.pipeline.render import table_tsv

    spec, setup = api.load_inputs(f"specs/experiments/{experiment}.yaml")
    mine = importer.import_spec(str(FIX / "llava-1.5-7b-hf")).spec
    a = api.run(spec, setup)
    b = api.run(mine, resolve_setup(load_yaml(f"specs/experiments/{experiment}.yaml"), mine))
    assert (a.allocated, a.reserved, a.device, a.estimate.first_step.total) == (b.allocated, b.reserved, b.device, b.estimate.first_step.total)
    assert table_tsv(a.rows) == table_tsv(b.rows)


# --------------------------------------------------------------------------- the hub path, from a local cache


def test_hub_id_from_the_cache(tmp_path):
    from huggingface_hub import constants

    hf.hub_cache(Path(constants.HF_HUB_CACHE), "llava-hf/llava-1.5-7b-hf", "llava-1.5-7b-hf", COMMIT)
    imported = importer.import_spec("llava-hf/llava-1.5-7b-hf")
    assert imported.data["source"] == {"repo": "llava-hf/llava-1.5-7b-hf", "revision": COMMIT}
    local = importer.import_spec(str(FIX / "llava-1.5-7b-hf"))
    assert imported.data["modules"] == local.data["modules"]
    assert f"revision: {COMMIT}" in imported.text


def test_hub_header_cached_by_memspec_when_the_shards_are_not(tmp_path):
    """The weights are not in huggingface_hub's cache: the header memspec kept is used."""
    from huggingface_hub import constants

    snapshot = hf.hub_cache(Path(constants.HF_HUB_CACHE), "meta-llama/Llama-3.2-1B", "Llama-3.2-1B", COMMIT)
    header = hub.read_header(snapshot / "model.safetensors", "x")
    (snapshot / "model.safetensors").unlink()
    with pytest.raises(MemspecError, match="E703"):
        importer.import_spec("meta-llama/Llama-3.2-1B")
    # a placeholder for the weights file keeps `model.safetensors` known to exist offline
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"lm": "model.safetensors"}}))
    kept = hub.cache_dir() / "meta-llama--Llama-3.2-1B" / COMMIT / "model.safetensors.header.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(header))
    assert importer.import_spec("meta-llama/Llama-3.2-1B").header_parameters == {"language": 1_235_814_400}


def test_revision_is_honoured(tmp_path):
    from huggingface_hub import constants

    hf.hub_cache(Path(constants.HF_HUB_CACHE), "meta-llama/Llama-2-7b-hf", "Llama-2-7b-hf", COMMIT)
    assert importer.import_spec("meta-llama/Llama-2-7b-hf", revision=COMMIT).data["source"]["revision"] == COMMIT


# --------------------------------------------------------------------------- errors, pinned


def test_a_hub_that_cannot_be_reached_answers_at_once(monkeypatch):
    """No network, HF_HUB_OFFLINE unset: one refused TCP connection decides, and the cache is
    read locally (huggingface_hub's timeouts and retries took about 23 s before the same E703)."""
    import socket

    from huggingface_hub import constants

    from compiler.inputs import hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in hub._PROXIES:
        monkeypatch.delenv(var, raising=False)
    probes = []

    def refused(address, timeout=None):
        probes.append((address, timeout))
        raise ConnectionRefusedError("no network")

    monkeypatch.setattr(socket, "create_connection", refused)
    hub._unreachable.cache_clear()
    try:
        assert _error(importer.import_spec, "meta-llama/Llama-2-7b-hf") == (
            "E703 repo 'meta-llama/Llama-2-7b-hf', revision 'main': config.json is not in the local cache and the hub cannot be reached\n"
            "help: run the same command once with network access (unset HF_HUB_OFFLINE), or import from a local folder"
        )
    finally:
        hub._unreachable.cache_clear()
    assert probes == [(("huggingface.co", 443), hub.PROBE_TIMEOUT_S)]


def test_offline_and_not_cached():
    assert _error(importer.import_spec, "meta-llama/Llama-2-7b-hf") == (
        "E703 repo 'meta-llama/Llama-2-7b-hf', revision 'main': config.json is not in the local cache and HF_HUB_OFFLINE is set\n"
        "help: run the same command once with network access (unset HF_HUB_OFFLINE), or import from a local folder"
    )


def _raising(cls):
    def download(repo, filename, revision):
        err = cls.__new__(cls)
        Exception.__init__(err, "from the hub")
        raise err

    return download


def test_repo_not_found(monkeypatch):
    from huggingface_hub import errors

    monkeypatch.setattr(hub, "_download", _raising(errors.RepositoryNotFoundError))
    assert _error(importer.import_spec, "nobody/nothing") == (
        "E701 repo 'nobody/nothing', revision 'main': repository not found on the Hugging Face hub (or it is private)\n"
        "help: check the id (owner/name); for a private repo set HF_TOKEN (or run `hf auth login`)"
    )


def test_gated(monkeypatch):
    from huggingface_hub import errors

    monkeypatch.setattr(hub, "_download", _raising(errors.GatedRepoError))
    assert _error(importer.import_spec, "meta-llama/Llama-2-7b-hf", revision="main") == (
        "E702 repo 'meta-llama/Llama-2-7b-hf', revision 'main': the repository is gated: your account has not been granted access, or no token was sent\n"
        "help: accept the license on https://huggingface.co/meta-llama/Llama-2-7b-hf, then set HF_TOKEN (or run `hf auth login`) and retry"
    )


def test_revision_not_found(monkeypatch):
    from huggingface_hub import errors

    monkeypatch.setattr(hub, "_download", _raising(errors.RevisionNotFoundError))
    assert _error(importer.import_spec, "meta-llama/Llama-2-7b-hf", revision="v9") == (
        "E704 repo 'meta-llama/Llama-2-7b-hf', revision 'v9': revision not found\nhelp: give a branch, tag or commit of the repo with --revision"
    )


def test_not_a_source():
    assert _error(importer.import_spec, "no-such-folder") == (
        "E701 'no-such-folder': is neither a model folder nor a Hugging Face repo id (owner/name)\n"
        "help: give a folder holding config.json and *.safetensors, or a repo id such as meta-llama/Llama-2-7b-hf"
    )


def test_folder_without_config(tmp_path):
    assert _error(importer.import_spec, str(tmp_path)) == (
        f"E705 folder '{tmp_path}': no config.json\nhelp: a model folder holds config.json next to its *.safetensors files"
    )


def _folder(tmp_path: Path, config: dict, tensors: list | None = None) -> str:
    folder = tmp_path / "model"
    hf.write_checkpoint(folder, config, tensors if tensors is not None else hf.llama_tensors(config))
    return str(folder)


def test_config_missing_a_required_key(tmp_path):
    config = {k: v for k, v in hf.TINY_LLAMA.items() if k != "hidden_size"}
    folder = _folder(tmp_path, config, hf.llama_tensors(hf.TINY_LLAMA))
    assert _error(importer.import_spec, folder) == (
        f"E706 folder '{folder}': config.json has none of hidden_size, n_embd (the llama family's 'hidden')\n"
        f"help: add the key to config.json, or give 'hidden' a default in {FAMILIES}/llama.yaml"
    )


def test_unknown_model_type(tmp_path):
    import yaml

    folder = _folder(tmp_path, {**hf.TINY_LLAMA, "model_type": "lama"}, hf.llama_tensors(hf.TINY_LLAMA))
    # every family file's model types, sorted: the list grows with each family added
    covered = sorted(t for f in (specs_dir() / "families").glob("*.yaml") for t in yaml.safe_load(f.read_text())["model_types"])
    assert _error(importer.import_spec, folder) == (
        f"E708 folder '{folder}': model_type 'lama' is not covered by any family (covered: {', '.join(covered)})\n"
        f"help: did you mean 'llama'? a family is one YAML file in {FAMILIES}/ (docs/adding-a-family.md)"
    )


def test_truncated_header(tmp_path):
    folder = _folder(tmp_path, hf.TINY_LLAMA)
    shard = Path(folder) / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    assert _error(importer.import_spec, folder).startswith(f"E707 folder '{folder}': model.safetensors is truncated: its header declares ")
    shard.write_bytes(b"\x01\x02")
    assert _error(importer.import_spec, folder) == (
        f"E707 folder '{folder}': model.safetensors is truncated: 2 bytes, fewer than the 8-byte header length\nhelp: the file is incomplete: download it again"
    )


def test_oversized_header(tmp_path):
    folder = _folder(tmp_path, hf.TINY_LLAMA)
    (Path(folder) / "model.safetensors").write_bytes((200_000_000).to_bytes(8, "little") + b"{}")
    assert _error(importer.import_spec, folder) == (
        f"E707 folder '{folder}': model.safetensors: header length 200,000,000 bytes exceeds safetensors' limit of 100,000,000\n"
        "help: the file is not a safetensors file or is corrupt"
    )


def test_header_not_json(tmp_path):
    folder = _folder(tmp_path, hf.TINY_LLAMA)
    (Path(folder) / "model.safetensors").write_bytes((4).to_bytes(8, "little") + b"{oops")
    assert _error(importer.import_spec, folder).startswith(f"E707 folder '{folder}': model.safetensors: the header is not valid JSON")


def test_unassigned_tensor(tmp_path):
    folder = _folder(tmp_path, hf.TINY_LLAMA, hf.llama_tensors(hf.TINY_LLAMA) + [("score.weight", "F16", [2, 64])])
    assert _error(importer.import_spec, folder) == (
        f"E709 folder '{folder}': 1 header tensors belong to no module of the llama family: score.weight F16[2, 64]\n"
        f"help: the module prefixes are lm_head., model.; add the missing prefix (or a buffer suffix under ignore_tensors) in {FAMILIES}/llama.yaml"
    )


def test_count_mismatch_names_the_tensors(tmp_path):
    # header: embeddings 256 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64) + norm 64 = 106_816;
    # a config.json saying intermediate 96 makes the formulas count 3 * 64 * 32 * 2 = 12_288 fewer
    folder = _folder(tmp_path, {**hf.TINY_LLAMA, "intermediate_size": 96}, hf.llama_tensors(hf.TINY_LLAMA))
    assert _error(importer.import_spec, folder) == (
        f"E710 folder '{folder}': module 'language': the formulas count 94,528 parameters, the header 106,816 (off by -12,288); its tensors: "
        "model.embed_tokens.weight F16[256, 64]; model.layers.{0..1}.input_layernorm.weight x2 F16[64]; "
        "model.layers.{0..1}.self_attn.q_proj.weight x2 F16[64, 64]; model.layers.{0..1}.self_attn.k_proj.weight x2 F16[32, 64]; "
        "model.layers.{0..1}.self_attn.v_proj.weight x2 F16[32, 64]; model.layers.{0..1}.self_attn.o_proj.weight x2 F16[64, 64]; "
        "model.layers.{0..1}.post_attention_layernorm.weight x2 F16[64]; model.layers.{0..1}.mlp.gate_proj.weight x2 F16[128, 64]; and 4 more groups\n"
        f"help: check the module's inputs in {FAMILIES}/llama.yaml against config.json, and its tensor prefixes against the header"
    )


def test_quantized_is_not_estimated_yet():
    folder = str(FIX / "tiny-llama-bnb-4bit")
    assert _error(importer.import_spec, folder) == (
        f"E711 folder '{folder}': quantized checkpoint (bitsandbytes: 14 weights stored as U8 (e.g. model.layers.0.self_attn.q_proj.weight); "
        "42 companion tensors (.absmax, .quant_map, .quant_state.bitsandbytes__nf4)): not estimated yet\n"
        "help: memspec counts 16- and 32-bit weights only; import the unquantized base model instead"
    )


def test_bin_only_falls_back_to_config_arithmetic(tmp_path, capsys):
    folder = tmp_path / "bin-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(hf.LLAMA_2_7B))
    (folder / "pytorch_model.bin").write_bytes(b"")
    imported = importer.import_spec(str(folder))
    assert imported.header_parameters is None
    assert imported.data["modules"]["language"]["parameters"] == 6_738_415_616
    assert any(n.startswith("No safetensors in the checkpoint (pytorch_model.bin)") for n in imported.data["notes"])
    assert main(["import", str(folder)]) == 0
    out = capsys.readouterr()
    assert "the formulas' count: no safetensors header to read" in out.out
    assert out.err.startswith("note: no safetensors in the checkpoint")


# --------------------------------------------------------------------------- the command


def test_import_prints_and_writes(tmp_path, capsys):
    folder = "tests/fixtures/hub/Llama-3.2-1B"
    assert main(["import", folder]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("# Imported by `memspec import tests/fixtures/hub/Llama-3.2-1B` with the llama family")
    out = tmp_path / "specs" / "llama" / "llama-3.2-1b.yaml"
    assert main(["import", folder, "-o", str(out)]) == 0
    assert out.read_text() == printed
    assert main(["check", str(out)]) == 0
    assert "parameters: 1_235_814_400   # header: 146 tensors, BF16 x146" in printed


def test_import_json(capsys):
    assert main(["import", str(FIX / "Meta-Llama-3-8B"), "--format", "json", "--model", "llama-3-8b"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "llama-3-8b"
    assert data["modules"]["language"]["parameters"] == 8_030_261_248


def test_never_overwrites_without_force(tmp_path, capsys):
    out = tmp_path / "spec.yaml"
    out.write_text("keep me\n")
    assert main(["import", str(FIX / "Llama-3.2-1B"), "-o", str(out)]) == 1
    assert capsys.readouterr().err == f"{out}: E712 already exists; not overwritten\nhelp: pass --force to replace it, or choose another -o path\n"
    assert out.read_text() == "keep me\n"
    assert main(["import", str(FIX / "Llama-3.2-1B"), "-o", str(out), "--force"]) == 0
    assert out.read_text().startswith("# Imported by")


def test_write_is_atomic(tmp_path, monkeypatch):
    out = tmp_path / "spec.yaml"
    out.write_text("old\n")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(importer.os, "replace", fail)
    with pytest.raises(OSError):
        importer.write_spec(out, "new\n", force=True)
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]  # no temporary file left


def test_estimate_a_folder_or_hub_id(capsys):
    from huggingface_hub import constants

    assert main(["estimate", str(FIX / "Llama-3.2-1B"), "--micro-batch", "2", "--seq-len", "1024", "--format", "json"]) == 0
    folder = json.loads(capsys.readouterr().out)
    hf.hub_cache(Path(constants.HF_HUB_CACHE), "meta-llama/Llama-3.2-1B", "Llama-3.2-1B", COMMIT)
    assert main(["estimate", "meta-llama/Llama-3.2-1B", "--micro-batch", "2", "--seq-len", "1024", "--format", "json"]) == 0
    by_id = json.loads(capsys.readouterr().out)
    assert folder["peak"] == by_id["peak"] if "peak" in folder else folder["allocated"] == by_id["allocated"]


def test_a_dry_run_takes_the_trainers_defaults_and_the_api_asks(capsys):
    # the command line: the trainers' defaults, each said on stderr
    assert main(["estimate", str(FIX / "Llama-3.2-1B")]) == 0
    out, err = capsys.readouterr()
    assert "setup     micro-batch 8 x 0 image(s) | seq 1024 |" in out
    assert err.splitlines() == [
        "note: no --micro-batch: 8, transformers' TrainingArguments default per_device_train_batch_size",
        "note: no --seq-len: 1024, TRL's SFTConfig default max_length, image tokens included",
    ]
    # the Python API takes no default: a caller states both
    with pytest.raises(MemspecError) as exc:
        importer.source_inputs(str(FIX / "Llama-3.2-1B"), {})
    assert "E201 $.micro_batch: missing micro-batch\nhelp: give --micro-batch N or use an experiment file" in exc.value.render()
    assert "E201 $.seq_len: missing seq-len" in exc.value.render()


def test_imported_text_equals_hand_written_numbers():
    text = importer.import_spec(str(FIX / "llava-1.5-7b-hf")).text
    for line in ("parameters: 303_507_456", "parameters: 20_979_712", "parameters: 6_738_939_904", "image_tokens: 576"):
        assert line in text


# --------------------------------------------------------------------------- families and imports


def test_family_files_check(capsys):
    assert main(["check", "specs/families"]) == 0


def test_family_expression_typo_is_located(tmp_path, capsys):
    bad = tmp_path / "llama.yaml"
    bad.write_text((ROOT / "specs" / "families" / "llama.yaml").read_text().replace("derive: hidden // n_heads", "derive: hiden // n_heads"))
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:14:45: E401 $.config.head_dim.derive: undeclared name 'hiden' in 'hiden // n_heads'" in err
    assert err.endswith("help: did you mean 'hidden'?\n")


def test_estimating_a_spec_never_imports_huggingface_hub():
    code = (
        "import sys\nfrom compiler.cli import main\n"
        "rc = main(['estimate', 'specs/experiments/llava-1.5-7b-finetune.yaml', '--format', 'json'])\n"
        "sys.stderr.write('HUB=' + str('huggingface_hub' in sys.modules) + '\\n')\nsys.exit(rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr
    assert "HUB=False" in out.stderr
    out = subprocess.run(
        [sys.executable, "-c", "import compiler, compiler.inputs.hub, compiler.inputs.importer, sys; print('huggingface_hub' in sys.modules)"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- mixture of experts


def test_qwen3_moe_experts_reach_the_spec():
    inputs = importer.import_spec(str(FIX / "Qwen3-30B-A3B")).data["modules"]["language"]["inputs"]
    # the experts' width is moe_intermediate_size, not the (unused) dense intermediate_size 6144
    assert (inputs["n_experts"], inputs["top_k"], inputs["intermediate"]) == (128, 8, 768)
    assert (inputs["norm_topk"], inputs["fp32_routing"], inputs["qk_norm"]) == (True, False, True)


def test_mixtral_experts_reach_the_spec():
    inputs = importer.import_spec(str(FIX / "Mixtral-8x7B-v0.1")).data["modules"]["language"]["inputs"]
    assert (inputs["n_experts"], inputs["top_k"], inputs["intermediate"]) == (8, 2, 14336)
    assert inputs["sliding_window"] == 0  # config.json "sliding_window": null: no window


def _tiny_mixtral(**changes) -> dict:
    return {
        **hf.MIXTRAL_8X7B_V01,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "vocab_size": 128,
        **changes,
    }


def test_mixtral_tiny_counts_every_expert(tmp_path):
    config = _tiny_mixtral()
    imported = importer.import_spec(_folder(tmp_path, config, hf.llama_tensors(config, moe="mixtral")))
    # per layer: q, o 64^2, k, v 32 x 64 (4096 + 2 * 2048 + 4096 = 12_288), router 4 x 64 = 256,
    # 4 experts x 3 x 64 x 96 = 73_728, norms 2 * 64: 86_400; 2 layers + 2 * 128 x 64 + norm 64
    assert imported.header_parameters == {"language": 2 * 86_400 + 2 * 8192 + 64}
    assert importer.formula_counts(imported.spec) == {"language": 189_248}


def test_mixtral_missing_expert_weight_is_a_count_mismatch(tmp_path):
    config = _tiny_mixtral()
    tensors = [t for t in hf.llama_tensors(config, moe="mixtral") if t[0] != "model.layers.1.block_sparse_moe.experts.3.w3.weight"]
    assert _error(importer.import_spec, _folder(tmp_path, config, tensors)).startswith(
        f"E710 folder '{tmp_path / 'model'}': module 'language': the formulas count 189,248 parameters, the header 183,104 (off by +6,144)"
    )  # one w3, 96 x 64


def test_mixtral_router_aux_loss_reaches_the_spec(tmp_path):
    config = _tiny_mixtral(output_router_logits=True)
    imported = importer.import_spec(_folder(tmp_path, config, hf.llama_tensors(config, moe="mixtral")))
    assert imported.data["modules"]["language"]["inputs"]["router_aux"] is True


@pytest.mark.parametrize(
    "changes, message",
    [
        # NB: a family's config values are integers, booleans or strings: a non-zero jitter is refused
        # as a float before the family's own check (jitter == 0) can say why
        ({"router_jitter_noise": 0.01}, "E713"),
        ({"router_jitter_noise": 1}, "router_jitter_noise (multiplicative noise on the MoE input in training) is not modelled"),
    ],
)
def test_mixtral_training_variants_not_modelled_are_refused(tmp_path, changes, message):
    config = _tiny_mixtral(**changes)
    assert message in _error(importer.import_spec, _folder(tmp_path, config, hf.llama_tensors(config, moe="mixtral")))


def test_qwen3_moe_dense_layers_are_refused(tmp_path):
    config = {
        **hf.QWEN3_30B_A3B,
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 128,
    }
    tensors = hf.llama_tensors(config, qk_norm=True, moe="qwen3_moe")
    assert importer.import_spec(_folder(tmp_path / "sparse", config, tensors)).header_parameters == {
        # per layer: q, o 64 x 64, k, v 32 x 64 (12_288), q_norm, k_norm 16 each, router 4 x 64,
        # 4 experts x 3 x 64 x 32 = 24_576, norms 2 * 64: 37_280; + 2 * 128 x 64 + norm 64
        "language": 2 * 37_280 + 2 * 8192 + 64
    }
    assert "decoder_sparse_step > 1 (dense MLP layers between the sparse ones) is not modelled" in _error(
        importer.import_spec, _folder(tmp_path / "step2", {**config, "decoder_sparse_step": 2}, tensors)
    )


def test_qwen2_moe_experts_reach_the_spec():
    inputs = importer.import_spec(str(FIX / "Qwen1.5-MoE-A2.7B")).data["modules"]["language"]["inputs"]
    # the routed experts' width is moe_intermediate_size (1408), the shared expert's
    # shared_expert_intermediate_size (5632), not the dense intermediate_size (5632 too here)
    assert (inputs["n_experts"], inputs["top_k"], inputs["intermediate"], inputs["shared_intermediate"]) == (60, 4, 1408, 5632)
    # qkv_bias is not in the released config.json: Qwen2MoeConfig's default, true
    assert (inputs["norm_topk"], inputs["fp32_routing"], inputs["qkv_bias"]) == (False, False, True)
    inputs = importer.import_spec(str(FIX / "Qwen2-57B-A14B")).data["modules"]["language"]["inputs"]
    assert (inputs["n_experts"], inputs["top_k"], inputs["intermediate"], inputs["shared_intermediate"], inputs["n_kv_heads"]) == (64, 8, 2560, 20480, 4)


def _tiny_qwen2_moe(**changes) -> dict:
    return {
        **hf.QWEN1_5_MOE_A2_7B,
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 128,
        **changes,
    }


def test_qwen2_moe_tiny_counts_the_shared_expert(tmp_path):
    config = _tiny_qwen2_moe()
    imported = importer.import_spec(_folder(tmp_path, config, hf.llama_tensors(config, qkv_bias=True, moe="qwen2_moe")))
    # per layer: q 64 x 64 + 64, k, v 32 x 64 + 32 each, o 64 x 64 (12_416), router 4 x 64 = 256,
    # 4 experts x 3 x 64 x 32 = 24_576, shared expert 3 x 64 x 48 = 9_216, its gate 64, norms
    # 2 * 64: 46_656; 2 layers + 2 * 128 x 64 + norm 64
    assert imported.header_parameters == {"language": 2 * 46_656 + 2 * 8192 + 64}
    assert importer.formula_counts(imported.spec) == {"language": 109_760}


def test_qwen2_moe_missing_shared_expert_gate_is_a_count_mismatch(tmp_path):
    config = _tiny_qwen2_moe()
    tensors = [t for t in hf.llama_tensors(config, qkv_bias=True, moe="qwen2_moe") if t[0] != "model.layers.1.mlp.shared_expert_gate.weight"]
    assert _error(importer.import_spec, _folder(tmp_path, config, tensors)).startswith(
        f"E710 folder '{tmp_path / 'model'}': module 'language': the formulas count 109,760 parameters, the header 109,696 (off by +64)"
    )  # one gate, 1 x 64


def test_qwen2_moe_router_aux_loss_reaches_the_spec(tmp_path):
    config = _tiny_qwen2_moe(output_router_logits=True)
    imported = importer.import_spec(_folder(tmp_path, config, hf.llama_tensors(config, qkv_bias=True, moe="qwen2_moe")))
    assert imported.data["modules"]["language"]["inputs"]["router_aux"] is True


@pytest.mark.parametrize("changes", [{"mlp_only_layers": []}, {"mlp_only_layers": None}, {"decoder_sparse_step": 1}])
def test_qwen2_moe_every_layer_sparse_is_accepted(tmp_path, changes):
    config = _tiny_qwen2_moe(**changes)
    assert importer.import_spec(_folder(tmp_path, config, hf.llama_tensors(config, qkv_bias=True, moe="qwen2_moe"))).header_parameters == {"language": 109_760}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"decoder_sparse_step": 2}, "sparse_step == 1 is false (decoder_sparse_step other than 1 (dense MLP layers between the sparse ones) is not modelled"),
        ({"decoder_sparse_step": 0}, "sparse_step == 1 is false"),
        ({"mlp_only_layers": [1]}, "first_mlp_only == -1 is false (mlp_only_layers (dense MLP layers in place of sparse ones) is not modelled"),
        ({"mlp_only_layers": [0, 1]}, "first_mlp_only == -1 is false"),
        ({"num_experts": 0}, "n_experts > 0 is false"),
        ({"experts_implementation": "eager"}, "experts_impl == 'grouped_mm' is false"),
        ({"use_sliding_window": True}, "use_sliding_window is not modelled"),
        ({"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size must be positive"),
    ],
)
def test_qwen2_moe_variants_not_modelled_are_refused(tmp_path, changes, message):
    config = _tiny_qwen2_moe(**changes)
    err = _error(importer.import_spec, _folder(tmp_path, config, hf.llama_tensors(_tiny_qwen2_moe(), qkv_bias=True, moe="qwen2_moe")))
    assert err.startswith("E713 ") and "not supported by the qwen2_moe family" in err and message in err, err


def test_deepseek_v2_attention_and_experts_reach_the_spec():
    inputs = importer.import_spec(str(FIX / "DeepSeek-V2-Lite")).data["modules"]["language"]["inputs"]
    # q_lora_rank null: one q_proj; the dense MLP's width is intermediate_size, the experts'
    # moe_intermediate_size, the shared experts' n_shared_experts times it; greedy routing
    assert (inputs["q_lora_rank"], inputs["kv_lora_rank"], inputs["nope_dim"], inputs["rope_dim"], inputs["v_dim"]) == (0, 512, 128, 64, 128)
    assert (inputs["intermediate"], inputs["expert_intermediate"], inputs["shared_intermediate"], inputs["dense_layers"]) == (10944, 1408, 2816, 1)
    assert (inputs["n_experts"], inputs["top_k"], inputs["groups"]) == (64, 6, 0)
    inputs = importer.import_spec(str(FIX / "DeepSeek-V2")).data["modules"]["language"]["inputs"]
    # group_limited_greedy over 8 groups of 20 experts
    assert (inputs["q_lora_rank"], inputs["n_experts"], inputs["groups"], inputs["shared_intermediate"]) == (1536, 160, 8, 3072)


def _tiny_deepseek_v2(**changes) -> dict:
    return {
        **hf.DEEPSEEK_V2_LITE,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 128,
        **changes,
    }


def test_deepseek_v2_tiny_counts_dense_and_moe_layers(tmp_path):
    config = _tiny_deepseek_v2()
    imported = importer.import_spec(_folder(tmp_path, config, hf.deepseek_v2_tensors(config)))
    # attention: q_proj 4 * 12 x 64 = 3_072, kv_a_proj_with_mqa (16 + 4) x 64 = 1_280, kv_a_layernorm 16,
    # kv_b_proj 4 * 16 x 16 = 1_024, o_proj 64 x 32 = 2_048; norms 2 * 64: 7_568 a layer; layer 0's
    # MLP 3 * 64 * 96 = 18_432; 2 MoE blocks of router 4 x 64 = 256, experts 4 x 3 x 64 x 32 = 24_576,
    # shared experts 3 * 64 * 64 = 12_288; embeddings and head 2 * 128 x 64, norm 64
    assert imported.header_parameters == {"language": 3 * 7_568 + 18_432 + 2 * 37_120 + 2 * 8192 + 64}
    assert importer.formula_counts(imported.spec) == imported.header_parameters
    config = _tiny_deepseek_v2(q_lora_rank=24)
    imported = importer.import_spec(_folder(tmp_path / "q_lora", config, hf.deepseek_v2_tensors(config)))
    # q_a_proj 24 x 64 = 1_536, q_a_layernorm 24, q_b_proj 4 * 12 x 24 = 1_152 in place of q_proj's 3_072
    assert imported.header_parameters == {"language": 3 * (7_568 - 3_072 + 1_536 + 24 + 1_152) + 18_432 + 2 * 37_120 + 2 * 8192 + 64}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"topk_method": "noaux_tc"}, "topk_method 'greedy' or 'group_limited_greedy' only"),
        ({"num_key_value_heads": 2}, "num_key_value_heads below num_attention_heads"),
        ({"moe_layer_freq": 2}, "moe_layer_freq other than 1 is not modelled"),
        ({"n_shared_experts": 0}, "n_shared_experts must be positive"),
        ({"experts_implementation": "eager"}, "experts_impl == 'grouped_mm' is false"),
        ({"output_router_logits": True}, "output_router_logits"),
        ({"attention_dropout": 0.1}, "attention_dropout above 0 is not modelled"),
        ({"first_k_dense_replace": 3}, "first_k_dense_replace must leave at least one MoE layer"),
    ],
)
def test_deepseek_v2_variants_not_modelled_are_refused(tmp_path, changes, message):
    config = _tiny_deepseek_v2(**changes)
    err = _error(importer.import_spec, _folder(tmp_path, config, hf.deepseek_v2_tensors(_tiny_deepseek_v2())))
    assert err.startswith("E713 ") and "not supported by the deepseek_v2 family" in err and message in err, err


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_nextn_predict_layers": 1}, "multi-token-prediction layers"),
        ({"num_key_value_heads": 8}, "num_key_value_heads below num_attention_heads"),
        ({"experts_implementation": "eager"}, "experts_impl == 'grouped_mm' is false"),
    ],
)
def test_deepseek_v3_variants_not_modelled_are_refused(tmp_path, changes, message):
    config = {**hf.MOONLIGHT_16B_A3B, **changes}
    tiny = {**hf.MOONLIGHT_16B_A3B, "num_hidden_layers": 2, "vocab_size": 128}
    err = _error(importer.import_spec, _folder(tmp_path, {**config, "num_hidden_layers": 2, "vocab_size": 128}, hf.deepseek_v2_tensors(tiny)))
    assert err.startswith("E713 ") and "not supported by the deepseek_v3 family" in err and message in err, err


def test_gemma2_spec_lists_the_attention_transformers_accepts(capsys):
    """Gemma 2 refuses sdpa in transformers (no soft-capping): the spec says eager or flash,
    an estimate that names none gets eager, and sdpa is refused with E714."""
    imported = importer.import_spec(str(FIX / "gemma-2-2b"))
    assert imported.data["attention"] == ["eager", "flash_attention_2"]
    assert "attention: [eager, flash_attention_2]" in imported.text
    spec = api.load_spec("specs/gemma2/gemma-2-2b.yaml")
    assert resolve_setup(None, spec, {"micro_batch": 1, "seq_len": 1024, "images_per_sample": 0}).attention == "eager"
    code = main(["estimate", "specs/gemma2/gemma-2-2b.yaml", "--micro-batch", "1", "--seq-len", "1024", "--images-per-sample", "0", "--attention", "sdpa"])
    assert code == 2
    assert "E714 --attention: gemma-2-2b does not run with attention 'sdpa' in transformers" in capsys.readouterr().err
    # a spec without the list keeps the old default
    assert resolve_setup(None, api.load_spec("specs/qwen2/qwen2.5-0.5b.yaml"), {"micro_batch": 1, "seq_len": 8, "images_per_sample": 0}).attention == "sdpa"


def test_paligemma_attention_follows_the_language_model():
    """The family's attention list is an expression: PaliGemma 2's Gemma 2 refuses sdpa,
    PaliGemma's Gemma takes all three (sdpa first, transformers' default)."""
    assert importer.import_spec(str(FIX / "paligemma2-3b-pt-448")).data["attention"] == ["eager", "flash_attention_2"]
    pg1 = importer.import_spec(str(FIX / "paligemma-3b-pt-224"))
    assert pg1.data["attention"] == ["sdpa", "eager", "flash_attention_2"]
    # (224 // 14)^2 = 256 image tokens per image; PaliGemma 2 at 448: (448 // 14)^2 = 1024
    assert pg1.data["image_tokens"] == 256
    assert importer.import_spec(str(FIX / "paligemma2-3b-pt-448")).data["image_tokens"] == 1024
    # 896 px: (896 // 14)^2 = 4096
    assert importer.import_spec(str(FIX / "paligemma2-3b-pt-896")).data["image_tokens"] == 4096


def test_smolvlm2_imports_with_the_idefics3_family_and_says_video_is_not_modelled():
    """model_type smolvlm (SmolVLMForConditionalGeneration) is one of the idefics3 family's;
    SmolVLM2's preprocessor_config.json adds video_sampling, which the family reads and the
    summary names as not modelled; SmolVLM (v1) has none and its summary says nothing of video."""
    smol2 = importer.import_spec(str(FIX / "SmolVLM2-500M-Video-Instruct"))
    assert smol2.family == "idefics3"
    assert "samples videos (video_sampling" in smol2.data["summary"] and "not modelled" in smol2.data["summary"]
    # 768 x 1024: longest edge to 2048, 3 x 4 tiles of 512 + the global one, (512 // 16)^2 // 4^2 = 64 tokens each
    assert smol2.data["modules"]["language"]["inputs"]["image_tokens"] == 64
    assert "video" not in importer.import_spec(str(FIX / "SmolVLM-Instruct")).data["summary"]


@pytest.mark.parametrize(
    ("fixture", "context", "key"),
    [
        ("Qwen-7B", 8192, "seq_length"),  # max_position_embeddings 32768: dynamic NTK at inference only
        ("chatglm3-6b", 8192, "seq_length"),  # no max_position_embeddings
        ("bloomz-7b1", 2048, "seq_length"),  # ALiBi: no position table, the trained context
        ("Llama-2-7b-hf", 4096, "max_position_embeddings"),
        ("llava-1.5-7b-hf", 4096, "max_position_embeddings"),  # text_config's
    ],
)
def test_context_length_is_the_trained_context(fixture, context, key):
    """fit proposes sequences up to the spec's context_length: a config's seq_length (the
    trained context) where it has one, else max_position_embeddings."""
    config = json.loads((hf.FIXTURES / fixture / "config.json").read_text())
    assert importer.context_length(config) == (context, key)
    assert importer.import_spec(str(hf.FIXTURES / fixture)).spec.context_length == context


@pytest.mark.parametrize("text_config", ["x", -1, [1, "a"]])
def test_a_sub_config_that_is_no_mapping_is_refused_not_defaulted(tmp_path, text_config):
    """text_config holding a string, a number or a list: the family's values under it are not
    given Hugging Face's defaults (which a missing or null text_config gets) but refused once,
    naming the key; it ended in an internal error (exit 3) before."""
    import shutil

    shutil.copytree(FIX / "llava-1.5-7b-hf", tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    (tmp_path / "model" / "config.json").write_text(json.dumps({**config, "text_config": text_config}))
    err = _error(importer.import_spec, str(tmp_path / "model"))
    assert err.count("E713") == 1, err
    assert f"E713 folder '{tmp_path / 'model'}': config.json text_config = {text_config!r} is not a mapping (the llava family's" in err
    assert "help: text_config holds a sub-config, a JSON object, or null for Hugging Face's defaults" in err
