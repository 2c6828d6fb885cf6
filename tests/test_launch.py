"""Reading what users already have: LLaVA's own launch scripts and DeepSpeed configs
(tests/fixtures/launch/, as published) give the same setup, hence the same estimate, as the
experiment files that describe them; DeepSpeed JSON is read as DeepSpeed and HF Trainer read
it ("auto", 5e8, offload, unknown keys)."""

from dataclasses import replace

import pytest

from compiler.inputs import launch
from compiler.cli import _report, main, parser
from compiler.errors import MemspecError

LAUNCH = "tests/fixtures/launch/scripts"
SPEC = "specs/llava/llava-1.5-7b.yaml"
H = 4096  # LLaVA-1.5-7B hidden_size


def _report_of(argv):
    return _report(parser().parse_args(argv))


def _same_setup(a, b):
    """Equal but for the names of the files they came from."""
    return replace(a, experiment="", file="") == replace(b, experiment="", file="")


@pytest.mark.parametrize(
    "script, experiment, extra",
    [
        # the scripts do not say how many GPUs (deepspeed uses every visible one): the
        # experiments' dp and GPU are passed explicitly
        ("pretrain.sh", "llava-1.5-7b-pretrain.yaml", ["--dp", "8", "--gpu", "a100-80gb"]),
        ("finetune.sh", "llava-1.5-7b-finetune.yaml", ["--dp", "8", "--gpu", "a100-80gb"]),
        ("finetune_lora.sh", "llava-1.5-7b-lora.yaml", ["--dp", "4", "--gpu", "a100-40gb"]),
    ],
)
def test_llava_scripts_estimate_as_their_experiments(script, experiment, extra, capsys):
    from_script = _report_of(["estimate", "--from-command", f"{LAUNCH}/v1_5/{script}", SPEC, *extra])
    from_file = _report_of(["estimate", f"specs/experiments/{experiment}"])
    assert _same_setup(from_script.setup, from_file.setup)
    assert (from_script.allocated, from_script.reserved, from_script.device) == (from_file.allocated, from_file.reserved, from_file.device)
    err = capsys.readouterr().err
    ignored = next(line for line in err.splitlines() if line.startswith("note: ignored flags (no effect on memory): "))
    assert "--data_path" in ignored and "--tf32" in ignored and "--bf16" not in ignored
    assert "--model_name_or_path lmsys/vicuna-13b-v1.5 is not read" in err


def test_a_script_on_an_experiment_keeps_its_dp_and_gpu():
    r = _report_of(["estimate", "--from-command", f"{LAUNCH}/v1_5/pretrain.sh", "specs/experiments/llava-1.5-7b-pretrain.yaml"])
    assert (r.setup.dp, r.setup.gpu.key, r.setup.micro_batch) == (8, "a100-80gb", 32)


def test_memspec_flags_win_over_the_script():
    r = _report_of(["estimate", "--from-command", f"{LAUNCH}/v1_5/finetune.sh", SPEC, "--micro-batch", "4", "--zero", "2"])
    assert (r.setup.micro_batch, r.setup.zero) == (4, 2)


def _script(tmp_path, text, name="train.sh"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_torchrun_continuations_comments_quotes(tmp_path):
    path = _script(
        tmp_path,
        """#!/bin/bash
# a comment, then an assignment the command uses
BATCH=4
CUDA_VISIBLE_DEVICES=0,1,2,3 torchrun --nproc_per_node 4 --nnodes=2 train.py \\
    --per_device_train_batch_size $BATCH \\
    --model_max_length 1024 \\
    --run_name "a quoted # not a comment" \\
    --bf16 \\
    --optim adamw_torch_fused  # trailing comment
""",
    )
    cmd = launch.read_command(path)
    assert (cmd.launcher, cmd.entry, cmd.gpus, cmd.nodes, cmd.line) == ("torchrun", "train.py", 4, 2, 4)
    r = launch.command_overrides(cmd, {"language": {"type": "llama_causal_lm", "inputs": {}}}, "m")
    o = r.overrides
    assert (o["micro_batch"], o["seq_len"], o["precision"], o["dp"]) == (4, 1024, "bf16-mixed", 8)
    assert o["optimizer"] == {"type": "adamw", "impl": "fused"}
    assert o["trainable"] == ["language"]
    assert "--run_name" in " ".join(r.notes)


def test_accelerate_and_python_launchers(tmp_path):
    acc = launch.read_command(_script(tmp_path, "accelerate launch --num_processes 8 --multi_gpu train.py --fp16 True\n"))
    assert (acc.launcher, acc.gpus, acc.nodes) == ("accelerate", 8, 1)
    py = launch.read_command(_script(tmp_path, "python -u train.py --per_device_train_batch_size 2\n", "py.sh"))
    assert (py.launcher, py.gpus) == ("python", 1)
    ds = launch.read_command(_script(tmp_path, "deepspeed --include localhost:0,1 train.py\n", "ds.sh"))
    assert ds.gpus == 2


def test_no_precision_flag_is_fp32_as_in_hf_trainer(tmp_path):
    cmd = launch.read_command(_script(tmp_path, "python train.py --per_device_train_batch_size 2\n"))
    assert launch.command_overrides(cmd, {"language": {}}, "m").overrides["precision"] == "fp32"


# --------------------------------------------------------------------------- DeepSpeed JSON


def _ds(tmp_path, text, explicit=None):
    path = tmp_path / "ds.json"
    path.write_text(text)
    return launch.read_deepspeed(str(path), explicit)


def test_llava_zero3_json_resolves_auto_from_hidden_size():
    r = _report_of(["estimate", SPEC, "--micro-batch", "1", "--seq-len", "1024", "--dp", "8", "--deepspeed", f"{LAUNCH}/zero3.json"])
    ds = r.setup.deepspeed
    assert r.setup.zero == 3
    assert (ds.reduce_bucket, ds.prefetch_bucket) == (H * H, int(0.9 * H * H))  # 16_777_216, 15_099_494
    assert (ds.overlap_comm, ds.contiguous_gradients) == (True, True)
    assert r.setup.precision == "bf16-mixed"  # bf16 "auto" follows the setup's precision


def test_scientific_notation_and_deepspeed_defaults(tmp_path):
    r = _ds(tmp_path, '{"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": 1.5e7}}')
    assert r.overrides["deepspeed"] == {"zero": 2, "reduce_bucket_size": 500_000_000, "prefetch_bucket_size": 15_000_000}
    assert "precision" not in r.overrides and "micro_batch" not in r.overrides


def test_a_config_replaces_the_experiments_deepspeed_keys(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": {"stage": 2}}')
    r = _report_of(["estimate", "specs/experiments/llava-1.5-7b-finetune.yaml", "--deepspeed", str(path)])
    ds = r.setup.deepspeed
    # the experiment's auto sizes and overlap_comm do not leak in: DeepSpeed's defaults
    assert (r.setup.zero, ds.reduce_bucket, ds.overlap_comm) == (2, 500_000_000, False)


def test_an_empty_config_takes_deepspeeds_stage_0(tmp_path):
    """{} replaces the experiment's ZeRO-3 too: DeepSpeedZeroConfig.stage defaults to 0."""
    path = tmp_path / "ds.json"
    path.write_text("{}")
    r = _report_of(["estimate", "specs/experiments/llava-1.5-7b-finetune.yaml", "--deepspeed", str(path)])
    assert r.setup.zero == 0


def test_precision_and_micro_batch_numbers(tmp_path):
    r = _ds(tmp_path, '{"fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": 4}')
    assert (r.overrides["precision"], r.overrides["micro_batch"]) == ("fp16-mixed", 4)
    r = _ds(tmp_path, '{"fp16": {"enabled": false}, "bf16": {"enabled": false}}')
    assert r.overrides["precision"] == "fp32"


def test_unknown_and_unmodelled_keys_are_listed(tmp_path):
    r = _ds(tmp_path, '{"zero_optimization": {"stage": 1, "allgather_bucket_size": 5e8, "mystery": 1}, "steps_per_print": 10, "foo": {"bar": 1}}')
    text = "\n".join(r.notes)
    assert "not used (no effect on memory): steps_per_print" in text
    assert "not modelled (small effects assumed absent): zero_optimization.allgather_bucket_size" in text
    assert "unknown keys, not used: zero_optimization.mystery, foo" in text


def test_offload_deepspeed_lacks_is_refused_not_ignored(tmp_path):
    with pytest.raises(MemspecError) as err:
        _ds(tmp_path, '{"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}}')
    text = err.value.render()
    assert "ds.json:1:" in text and "E802 $.zero_optimization.offload_optimizer.device: offloading optimizer states to cpu under ZeRO-0" in text
    with pytest.raises(MemspecError) as err:
        _ds(tmp_path, '{"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}')
    assert (
        "E802 $.zero_optimization.offload_param.device: offloading parameters to cpu under ZeRO-2 is not modelled: parameter offload is a ZeRO-3 feature"
        in err.value.render()
    )
    with pytest.raises(MemspecError) as err:
        _ds(tmp_path, '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}}')
    assert "offloading optimizer states to nvme under ZeRO-2 is not modelled: DeepSpeed offloads to NVMe only with ZeRO-3" in err.value.render()
    assert _ds(tmp_path, '{"zero_optimization": {"offload_param": {"device": "none"}}}').overrides["deepspeed"] == {"zero": 0}  # no offload; the default stage
    # ZeRO-3 takes both, to either device
    both = '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "cpu"}}}'
    assert _ds(tmp_path, both).overrides["deepspeed"] == {"zero": 3, "offload_optimizer": "nvme", "offload_param": "cpu"}


def test_a_number_that_disagrees_with_the_command_is_an_error(tmp_path):
    with pytest.raises(MemspecError) as err:
        _ds(tmp_path, '{\n  "train_micro_batch_size_per_gpu": 8\n}', explicit={"micro_batch": 16})
    assert (
        "ds.json:2:3: E803 $.train_micro_batch_size_per_gpu: the config says micro-batch 8, the command line --per_device_train_batch_size says 16"
        in err.value.render()
    )


def test_cli_prints_notes_on_stderr_only(capsys):
    code = main(["estimate", SPEC, "--micro-batch", "1", "--seq-len", "1024", "--deepspeed", f"{LAUNCH}/zero2.json", "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0 and captured.out.startswith("{")
    assert "note: DeepSpeed config tests/fixtures/launch/scripts/zero2.json" in captured.err


def test_liger_and_padding_free_flags_set_the_loss_and_packing(tmp_path):
    cmd = launch.read_command(
        _script(
            tmp_path, "torchrun --nproc_per_node 8 sft.py --per_device_train_batch_size 8 --max_seq_length 2048 --bf16 --use_liger_kernel True --padding_free\n"
        )
    )
    o = launch.command_overrides(cmd, {"language": {"type": "llama_causal_lm", "inputs": {}}}, "m").overrides
    assert (o["loss"], o["packing"]) == ("fused_linear_cross_entropy", True)
    off = launch.read_command(_script(tmp_path, "python sft.py --use_liger_kernel False\n", "off.sh"))
    assert "loss" not in launch.command_overrides(off, {"language": {}}, "m").overrides


def test_trl_peft_flags_make_the_lora_block(tmp_path):
    """TRL's ModelConfig: --use_peft with its defaults (r 16, alpha 32, dropout 0.05), list
    flags taking every value up to the next flag, as HfArgumentParser's nargs='+'."""
    lm = {"language": {"type": "llama_causal_lm", "inputs": {}}}
    cmd = launch.read_command(
        _script(
            tmp_path, "accelerate launch sft.py --use_peft --lora_r 32 --lora_target_modules all-linear --lora_modules_to_save lm_head embed_tokens --bf16\n"
        )
    )
    o = launch.command_overrides(cmd, lm, "m").overrides
    assert o["lora"] == {
        "r": 32,
        "alpha": 32,
        "dropout": 0.05,
        "bias": "none",
        "target_modules": "all-linear",
        "modules_to_save": ["lm_head", "embed_tokens"],
        "modules": ["language"],
    }
    # no --lora_target_modules: peft's default for a Llama-style model type
    bare = launch.read_command(_script(tmp_path, "python sft.py --use_peft\n", "bare.sh"))
    assert launch.command_overrides(bare, lm, "m").overrides["lora"]["target_modules"] == ["q_proj", "v_proj"]


def test_trl_peft_flags_without_use_peft_or_targets_are_errors(tmp_path):
    lone = launch.read_command(_script(tmp_path, "python sft.py --lora_modules_to_save lm_head\n"))
    with pytest.raises(MemspecError) as e:
        launch.command_overrides(lone, {"language": {"type": "llama_causal_lm", "inputs": {}}}, "m")
    assert "E812" in str(e.value) and "--use_peft" in str(e.value)
    vlm = launch.read_command(_script(tmp_path, "python sft.py --use_peft\n", "vlm.sh"))
    with pytest.raises(MemspecError) as e:
        launch.command_overrides(vlm, {"vision": {"type": "clip_vision_tower"}, "language": {"type": "llama_causal_lm"}}, "m")
    assert "--lora_target_modules" in str(e.value)


def test_llava_lora_bias_all_reaches_the_language_model_only(tmp_path):
    """LLaVA's train.py builds the vision tower after get_peft_model, so --lora_bias all trains
    no CLIP bias: it is the adapted layers' biases ('lora_only'), and Vicuna has none, so the
    estimate is the one without the flag; bias='all' on the Hugging Face model (the whole
    model wrapped) reaches the tower and costs more."""
    text = (
        "deepspeed llava/train/train_mem.py --lora_enable True --lora_r 16 --per_device_train_batch_size 1 "
        "--model_max_length 2048 --bf16 True --gradient_checkpointing True --mm_projector_type mlp2x_gelu "
        "--vision_tower openai/clip-vit-large-patch14-336{}\n"
    )
    plain = _report_of(["estimate", "--from-command", _script(tmp_path, text.format("")), SPEC, "--dp", "1"])
    biased = _report_of(["estimate", "--from-command", _script(tmp_path, text.format(" --lora_bias all"), "b.sh"), SPEC, "--dp", "1"])
    assert biased.setup.lora.bias == "lora_only"
    assert biased.allocated == plain.allocated
    whole = _report_of(["estimate", "--from-command", _script(tmp_path, text.format(""), "c.sh"), SPEC, "--dp", "1", "--lora-bias", "all"])
    assert whole.allocated > plain.allocated
