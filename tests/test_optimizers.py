"""Optimizer states and step temporaries: worked examples with the arithmetic beside them,
pinned to the sources named in compiler/memory/optimizers.py (bitsandbytes cannot run on fake
tensors, so its numbers are checked here rather than against measured records)."""

import pytest

from compiler.api import estimate
from compiler.cli import main
from compiler.inputs.launch import OPTIM
from compiler.memory.optimizers import HF_OPTIM, Optimizer, State, once, states

ADAMW_8BIT = Optimizer("adamw", "bitsandbytes", bits=8)
PAGED_8BIT = Optimizer("adamw", "bitsandbytes", bits=8, paged=True)
QWEN = "specs/qwen2/qwen2.5-0.5b.yaml"
SMALL = dict(micro_batch=1, seq_len=1024, images_per_sample=0, trainable=["language"], attention="sdpa")


def test_8bit_adamw_state_of_a_llama_7b_q_proj():
    # 4096 x 4096 = 16_777_216 elements: two uint8 states, two fp32 absmax of 16_777_216 / 256 = 65_536 blocks
    assert states(ADAMW_8BIT, 16_777_216, (4096, 4096), 4) == (State(16_777_216), State(16_777_216), State(262_144), State(262_144))  # 65_536 * 4
    total = sum(s.nbytes for s in states(ADAMW_8BIT, 16_777_216, None, 4))
    assert total == 34_078_720  # 2 * 16_777_216 + 2 * 262_144: 2.03 B per element against AdamW's 8


def test_8bit_blocks_round_up_and_small_tensors_keep_fp32_states():
    # 4097 elements: 8-bit, ceil(4097 / 256) = 17 blocks
    assert states(ADAMW_8BIT, 4097, None, 4) == (State(4097), State(4097), State(68), State(68))
    # 4095 < min_8bit_size 4096: two fp32 states, 4095 * 4 = 16_380 B each (a norm weight of a small model)
    assert states(ADAMW_8BIT, 4095, None, 4) == (State(16_380), State(16_380))
    # bitsandbytes' 32-bit states are fp32 even for a bf16 weight (state_bytes 2 is ignored)
    assert states(Optimizer("adamw", "bitsandbytes"), 896, None, 2) == (State(3584), State(3584))


def test_paged_states_from_1e5_elements_leave_the_caching_allocator():
    # 896 x 896 = 802_816 >= 100_000: paged uint8 states; the absmax blocks are torch.zeros (not paged)
    assert states(PAGED_8BIT, 802_816, None, 4) == (State(802_816, True), State(802_816, True), State(12_544), State(12_544))  # 802_816 / 256 = 3136 blocks * 4
    # 99_999 elements: torch.zeros_like, counted
    assert all(not s.paged for s in states(PAGED_8BIT, 99_999, None, 4))


def test_lion_has_one_state_and_one_quantile_map():
    lion8 = Optimizer("lion", "bitsandbytes", bits=8)
    assert states(lion8, 16_777_216, None, 4) == (State(16_777_216), State(262_144))
    assert once(lion8, [16_777_216]) == (1024,)  # the signed map, 256 * 4
    assert once(ADAMW_8BIT, [16_777_216]) == (1024, 1024)  # dynamic + udynamic
    assert once(ADAMW_8BIT, [4095]) == ()  # nothing went 8-bit: no map moved to the GPU
    assert once(Optimizer("adamw", "bitsandbytes"), [16_777_216]) == ()


def test_adafactor_factors_matrices_and_keeps_vectors_whole():
    ada = Optimizer("adafactor", "forloop")
    # q_proj 896 x 896: exp_avg_sq_row 896 + exp_avg_sq_col 896, fp32, and the RMS scalar
    assert states(ada, 802_816, (896, 896), 2) == (State(3584), State(3584), State(4))
    # a bias of 896: full exp_avg_sq (fp32 whatever the weight dtype) + RMS
    assert states(ada, 896, (896,), 2) == (State(3584), State(4))
    # conv weight [1024, 3, 14, 14]: row = 1024*3*14 = 43_008, col = 1024*3*14 = 43_008
    assert states(ada, 602_112, (1024, 3, 14, 14), 4) == (State(172_032), State(172_032), State(4))
    # beta1 > 0 adds a full fp32 exp_avg first
    assert states(Optimizer("adafactor", "forloop", momentum=0.9), 802_816, (896, 896), 2)[0] == State(3_211_264)


def test_paged_states_lower_allocated_by_exactly_the_paged_bytes():
    plain = estimate(QWEN, **SMALL, optimizer={"type": "adamw", "impl": "bitsandbytes", "bits": 8})
    paged = estimate(QWEN, **SMALL, optimizer={"type": "adamw", "impl": "bitsandbytes", "bits": 8, "paged": True})
    note = next(x for x in paged.estimate.not_modelled if x.startswith("bitsandbytes paged"))
    paged_bytes = int(note.split(", ")[1].split(" B")[0].replace(",", ""))
    # every paged state is a uint8 tensor of 1e5+ elements, each a multiple of 512 B here (896 * k)
    assert plain.tensors - paged.tensors == paged_bytes
    assert paged.estimate.peak.phase == plain.estimate.peak.phase


def test_8bit_adamw_cuts_the_step_peak_against_torch_adamw():
    torch_adamw = estimate(QWEN, **SMALL)
    bnb = estimate(QWEN, **SMALL, optimizer={"type": "adamw", "impl": "bitsandbytes", "bits": 8})
    # AdamW foreach peaks at its _foreach_sqrt; bitsandbytes' fused kernels allocate no temporaries
    assert torch_adamw.estimate.peak.path == "optimizer.step"
    assert bnb.allocated < torch_adamw.allocated


def test_hf_optim_names_reach_the_experiment_and_the_cli(capsys):
    assert OPTIM is HF_OPTIM
    assert HF_OPTIM["paged_adamw_8bit"] == {"type": "adamw", "impl": "bitsandbytes", "bits": 8, "paged": True}
    assert HF_OPTIM["sgd"] == {"type": "sgd", "momentum": 0.0}  # Trainer's SGD: no momentum
    assert main(["estimate", QWEN, "--micro-batch", "1", "--seq-len", "1024", "--optimizer", "lion_8bit", "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert '"type": "lion"' in out and '"bits": 8' in out


def test_an_option_of_another_optimizer_is_an_error(capsys):
    code = main(["estimate", QWEN, "--micro-batch", "1", "--seq-len", "1024", "--optimizer", "adafactor", "--optimizer-impl", "fused"])
    err = capsys.readouterr().err
    assert code == 2
    assert "E305" in err and "adafactor has no 'fused' implementation" in err


@pytest.mark.parametrize("precision, upcasts", [("bf16-mixed", 0), ("bf16", 2)])
def test_adafactor_step_temporaries_of_the_largest_matrix(precision, upcasts):
    # Qwen2.5-0.5B's largest tensor is the 151_936 x 896 (tied) embedding: 136_134_656 elements
    from compiler.pipeline.walks.optimizer_step import _adafactor_temporaries
    from compiler.api import load_inputs

    _, setup = load_inputs(QWEN, {**SMALL, "precision": precision, "optimizer": {"type": "adafactor"}})
    n4 = 136_134_656 * 4  # 544_538_624, a multiple of 512
    vectors = 151_936 * 4 + 896 * 4  # 607_744 + 3584
    assert _adafactor_temporaries(setup, 136_134_656, (151_936, 896)) == upcasts * n4 + 2 * n4 + vectors


# ----------------------------------------------------------------------------- QLoRA


LLAVA_LORA = "specs/experiments/llava-1.5-7b-lora.yaml"
UNSHARDED = dict(dp=1, zero=0)


def _language_parameters(report) -> int:
    return report.estimate.resident["language"]["parameters"]


def test_qlora_packs_every_language_linear_but_lm_head():
    plain = estimate(LLAVA_LORA, **UNSHARDED)
    q = estimate(LLAVA_LORA, **UNSHARDED, quantization={"bits": 4, "double_quant": True})
    rows = {r.path: r for r in q.rows}
    base = rows["language.layers[0:32].self_attn.q_proj.base_layer"]
    assert base.type == "linear_4bit" and base.parameters == 8_388_608  # 4096 * 4096 / 2
    assert base.buffers == 267_332  # absmax 262_144 + offset 4 + state2.absmax 4096 + code 64 + state2.code 1024
    assert rows["language.lm_head"].type == "linear"  # the output embedding stays in bf16
    # Per layer the 4 attention (4096^2) and 3 MLP (4096 x 11008) weights lose 2 - 1/2 bytes
    # per element: 32 * (4 * 16_777_216 + 3 * 45_088_768) * 1.5 = 9_714_008_064, allocated per
    # tensor (each a multiple of 512 B) plus the quant states (absmax 1 B per 64 elements, ...).
    saved = _language_parameters(plain) - _language_parameters(q)
    packed = 32 * (4 * 16_777_216 + 3 * 45_088_768) * 3 // 2
    assert packed == 9_714_008_064
    assert 0 < packed - saved < packed // 50  # the quant states cost back under 2 %


def test_quantized_trainable_module_is_an_error(capsys):
    from compiler.cli import main as cli

    code = cli(
        ["estimate", "specs/llava/llava-1.5-7b.yaml", "--micro-batch", "1", "--seq-len", "1024", "--trainable", "projector,language", "--quantization", "4"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "E307" in err and "adapt them with LoRA" in err


def test_llava_bits_flag_reads_as_qlora(tmp_path):
    from compiler.inputs.launch import command_overrides, read_command

    script = tmp_path / "finetune_qlora.sh"
    script.write_text("deepspeed llava/train/train_mem.py --lora_enable True --bits 4 --bf16 True --per_device_train_batch_size 4 --model_max_length 2048\n")
    command = read_command(str(script))
    reading = command_overrides(command, {"vision": {}, "projector": {"type": "mlp_projector"}, "language": {}}, "llava")
    assert reading.overrides["quantization"] == {"bits": 4, "quant_type": "nf4", "double_quant": True, "modules": ["language"]}


def test_adafactor_refuses_a_parameter_without_a_shape(tmp_path):
    import shutil

    from compiler.api import library, load_inputs, run
    from compiler.errors import MemspecError

    folder = tmp_path / "formulas"
    shutil.copytree("formulas", folder)
    norm = folder / "rms_norm.yaml"
    norm.write_text(norm.read_text().replace("  parameters:       [{shape: [dim]}]", '  parameters:       "n_params * bytes.param"'))
    spec, setup = load_inputs(QWEN, {**SMALL, "optimizer": {"type": "adafactor"}})
    with pytest.raises(MemspecError) as e:
        run(spec, setup, library(str(folder)))
    (d,) = e.value.diagnostics
    assert d.code == "E306" and "rms_norm gives only its bytes" in d.message


def test_fsdp_refuses_the_optimizers_its_walk_does_not_model(capsys):
    code = main(["estimate", "specs/experiments/llava-1.5-7b-finetune.yaml", "--zero", "0", "--dp", "8", "--fsdp", "--optimizer", "paged_adamw_8bit"])
    err = capsys.readouterr().err
    assert code == 2 and "E308" in err and "not modelled with FSDP2" in err
