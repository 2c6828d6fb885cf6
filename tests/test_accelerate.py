"""accelerate config files (`accelerate config` output, `accelerate launch --config_file`) read
into a setup: tests/fixtures/accelerate/ holds configs as accelerate writes them. Every key is
used, noted as without effect on memory, or listed as unknown; what is not modelled is an
error at its line."""

import pytest

from compiler.inputs import launch
from compiler.api import estimate
from compiler.cli import _report, main, parser
from compiler.errors import MemspecError

ACC = "tests/fixtures/accelerate"
QWEN = "specs/qwen2/qwen2.5-0.5b.yaml"
LLAVA = "specs/llava/llava-1.5-7b.yaml"


def _read(name, modules=("language",)):
    return launch.read_accelerate(f"{ACC}/{name}", modules)


def test_fsdp2_config():
    r = _read("fsdp2.yaml")
    assert r.overrides == {"dp": 8, "precision": "bf16-mixed", "gradient_checkpointing": ["language"], "fsdp": {"reshard_after_forward": False}, "zero": 0}
    notes = "\n".join(r.notes)
    assert "fsdp_transformer_layer_cls_to_wrap Qwen2DecoderLayer: the units are taken as the model's decoder" in notes
    assert "not used (no effect on memory): compute_environment, debug, downcast_bf16" in notes
    assert "unknown keys" not in notes


def test_fsdp2_config_estimates_as_the_flags(capsys):
    from_file = _report(
        parser().parse_args(
            ["estimate", QWEN, "--micro-batch", "4", "--seq-len", "1024", "--images-per-sample", "0", "--accelerate-config", f"{ACC}/fsdp2.yaml"]
        )
    )
    from_flags = estimate(
        QWEN,
        micro_batch=4,
        seq_len=1024,
        images_per_sample=0,
        dp=8,
        precision="bf16-mixed",
        gradient_checkpointing=["language"],
        fsdp={"reshard_after_forward": False},
    )
    assert from_file.allocated == from_flags.allocated
    assert from_file.setup.fsdp == from_flags.setup.fsdp


def test_deepspeed_inline_offload_counts_all_machines():
    r = _read("deepspeed-zero2-offload.yaml")
    # num_processes is the total over num_machines (2 x 8)
    assert r.overrides["dp"] == 16
    assert r.overrides["deepspeed"] == {"zero": 2, "offload_optimizer": "cpu"}
    assert r.overrides["fsdp"] is None


def test_deepspeed_config_file_is_read_as_deepspeed_reads_it():
    r = _read("deepspeed-file.yaml", ("vision", "projector", "language"))
    assert r.overrides["dp"] == 8
    assert r.overrides["deepspeed"]["zero"] == 3
    assert r.overrides["deepspeed"]["reduce_bucket_size"] == "auto"
    assert r.overrides["deepspeed"]["sub_group_size"] == 1_000_000_000  # the JSON's own keys, as its reader reads them
    assert any("stage3_gather_16bit_weights_on_model_save" in n for n in r.notes)  # and its notes
    report = _report(parser().parse_args(["estimate", LLAVA, "--micro-batch", "16", "--seq-len", "2048", "--accelerate-config", f"{ACC}/deepspeed-file.yaml"]))
    assert (report.setup.zero, report.setup.dp, report.setup.deepspeed.reduce_bucket) == (3, 8, 4096 * 4096)


def test_multi_gpu_is_ddp():
    r = _read("multi-gpu.yaml")
    # NB: accelerate's mixed_precision without DeepSpeed or FSDP is torch.autocast on the
    # model as loaded (fp32), not DeepSpeed's fp32 masters of 16-bit weights
    assert r.overrides == {"dp": 4, "precision": "fp16-mixed", "precision_mode": "autocast", "fsdp": None, "zero": 0}


def test_mixed_precision_is_realized_as_the_distributed_type_does():
    from compiler.pipeline.resolve import precision_mode

    assert _read("deepspeed-zero2-offload.yaml").overrides["precision"] == "bf16-mixed"
    assert "precision_mode" not in _read("deepspeed-zero2-offload.yaml").overrides  # DeepSpeed stated: fp32 masters
    assert precision_mode("bf16-mixed", deepspeed_stated=True) == "master-weights"
    assert precision_mode("bf16-mixed", fsdp=True) == "fsdp-policy"
    assert precision_mode("bf16-mixed") == "autocast"  # stated, nothing else: Lightning's bf16-mixed
    assert precision_mode("bf16-mixed", precision_stated=False) == "master-weights"  # the default
    assert precision_mode("bf16") == "pure" and precision_mode("fp32") == "fp32"


def test_fsdp1_and_size_wrap_are_refused_at_their_lines():
    with pytest.raises(MemspecError) as err:
        _read("fsdp1-unknown-keys.yaml")
    text = err.value.render()
    assert "fsdp1-unknown-keys.yaml:2:1: E805 $.fsdp_config: FSDP version 1 (FullyShardedDataParallel, flat parameters) is not modelled" in text
    assert "fsdp1-unknown-keys.yaml:3:3: E805 $.fsdp_config.fsdp_auto_wrap_policy: auto wrap policy 'SIZE_BASED_WRAP' is not modelled" in text


def test_unknown_keys_are_listed_not_dropped(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmy_custom_key: 3\nfsdp_config:\n  fsdp_version: 2\n")
    notes = "\n".join(launch.read_accelerate(str(path)).notes)
    assert "unknown keys, not used: my_custom_key" in notes
    assert "fsdp_config is not used: distributed_type is MULTI_GPU" in notes


@pytest.mark.parametrize(
    "text, message",
    [
        ("distributed_type: FSDP\nnum_processes: eight\n", "E804 $.num_processes: expected a positive number of processes, got 'eight'"),
        ("distributed_type: PIPELINE\n", "E804 $.distributed_type: unknown distributed_type 'PIPELINE'"),
        ("distributed_type: XLA\n", "E805 $.distributed_type: distributed_type XLA is not modelled"),
        (
            "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_offload_params: true\n",
            "E805 $.fsdp_config.fsdp_offload_params: FSDP2 CPU offload (CPUOffloadPolicy) is not modelled yet",
        ),
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  offload_param_device: cpu\n",
            "E807 $.deepspeed_config.offload_param_device: parameter offload without optimizer offload",
        ),
        (
            "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  offload_param_device: cpu\n  offload_optimizer_device: cpu\n",
            "E802 $.deepspeed_config.offload_param_device: offloading parameters to cpu under ZeRO-2 is not modelled: parameter offload is a ZeRO-3 feature",
        ),
        ("mixed_precision: fp8\n", "E805 $.mixed_precision: mixed_precision 'fp8' is not modelled"),
        # a list or a mapping where a name belongs (an internal error before)
        ("mixed_precision: [bf16]\n", "E804 $.mixed_precision: expected mixed_precision no, bf16 or fp16, got ['bf16']"),
        ("distributed_type: {FSDP: 2}\n", "E804 $.distributed_type: unknown distributed_type {'FSDP': 2}"),
    ],
)
def test_bad_values(tmp_path, text, message):
    path = tmp_path / "a.yaml"
    path.write_text(text)
    with pytest.raises(MemspecError) as err:
        launch.read_accelerate(str(path))
    assert message in err.value.render()


def test_launch_script_reads_its_config_file(capsys):
    r = _report(parser().parse_args(["estimate", QWEN, "--from-command", f"{ACC}/launch.sh", "--images-per-sample", "0"]))
    assert (r.setup.dp, r.setup.micro_batch, r.setup.seq_len) == (8, 4, 1024)
    assert r.setup.fsdp is not None and not r.setup.fsdp.reshard_after_forward
    err = capsys.readouterr().err
    assert f"note: accelerate config {ACC}/fsdp2.yaml" in err
    assert "does not say how many GPUs" not in err


def test_flags_win_over_the_file(capsys):
    assert (
        main(
            [
                "estimate",
                QWEN,
                "--micro-batch",
                "4",
                "--seq-len",
                "1024",
                "--images-per-sample",
                "0",
                "--accelerate-config",
                f"{ACC}/fsdp2.yaml",
                "--dp",
                "2",
                "--fsdp-reduce-dtype",
                "bf16",
                "--format",
                "json",
            ]
        )
        == 0
    )
    import json

    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["parallel"] == {"dp": 2, "zero": 0, "fsdp": {"reshard_after_forward": False, "reduce_dtype": "bf16"}}


def test_dynamo_off_is_read_and_on_is_refused(tmp_path):
    # `accelerate config` writes dynamo_config: {dynamo_backend: 'NO'} when asked "no": no
    # compile, nothing unknown; a backend compiles the model, which is not modelled (E805)
    base = "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: bf16\n"
    (tmp_path / "off.yaml").write_text(base + "dynamo_config:\n  dynamo_backend: 'NO'\n")
    r = launch.read_accelerate(str(tmp_path / "off.yaml"), ("language",))
    assert r.overrides == {"dp": 2, "precision": "bf16-mixed", "precision_mode": "autocast", "fsdp": None, "zero": 0}
    assert not any("unknown" in n for n in r.notes)
    (tmp_path / "on.yaml").write_text(base + "dynamo_config:\n  dynamo_backend: INDUCTOR\n")
    with pytest.raises(MemspecError) as err:
        launch.read_accelerate(str(tmp_path / "on.yaml"), ("language",))
    assert err.value.render().startswith(f"{tmp_path / 'on.yaml'}:5:3: E805 $.dynamo_config.dynamo_backend: dynamo_backend INDUCTOR")
