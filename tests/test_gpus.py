"""The GPU catalog (specs/gpus.yaml), `--gpu` as a memory size, the margin every "fits" verdict
keeps free, and `memspec estimate --fail-if-oom`."""

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from compiler import api
from compiler.cli import EXIT_DOES_NOT_FIT, main
from compiler.commands.validation import record_report, validate_records
from compiler.pipeline.resolve import MIB, catalog_constants, gpu_catalog, parse_margin, parse_size

ROOT = Path(__file__).resolve().parent.parent
MEASURED = ROOT / "tests" / "measured"
TINY = "tests/measured/tiny/tiny-finetune.yaml"  # device 875,560,960 B: reserved 75,497,472 + CUDA context 800,063,488
FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"  # device 52,597,620,736 B (48.99 GiB) at dp 8, ZeRO-3


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_sizes_are_exact_integer_bytes():
    assert parse_size("24GiB") == 24 * 2**30 == 25_769_803_776
    assert parse_size("80GB") == 80 * 10**9
    assert parse_size("1.5GiB") == 1_610_612_736  # 1.5 x 2^30, exact
    assert parse_size("81559 MiB") == 81_559 * 2**20 == 85_520_809_984
    assert parse_size("24gib") == parse_size("24GiB")  # a unit is read without regard to case
    for bad, why in (
        ("24", "no unit"),
        ("24G", "unknown unit 'G'"),
        ("0.1B", "not a whole number of bytes (0.1)"),
        ("-1GB", "not a number followed by a unit"),
    ):
        with pytest.raises(ValueError, match=re.escape(why)):
            parse_size(bad)


def test_a_margin_is_a_percentage_or_a_size():
    h100 = 81_559 * MIB  # 85,520,809,984 B
    m = parse_margin("4.5%")
    # 4.5 % of 85,520,809,984 B = 3,848,436,449.28 B, rounded up to a byte kept free
    assert m.percent == Fraction(9, 2) and m.reserve(h100) == 3_848_436_450
    assert m.budget(h100) == 85_520_809_984 - 3_848_436_450 == 81_672_373_534
    assert parse_margin("4.5") == m  # a bare number is a percentage
    assert parse_margin("2GiB").reserve(h100) == 2_147_483_648 and parse_margin("2GB").reserve(h100) == 2_000_000_000
    assert parse_margin("0").budget(h100) == h100


# nvidia-smi's memory.total (MiB) and the architecture of each card added with the margin work
ADDED = {
    "v100-16gb": (16_160, "sm70"),
    "v100-32gb": (32_510, "sm70"),
    "l4-24gb": (23_034, "sm89"),
    "rtx3090-24gb": (24_576, "sm86"),
    "rtxa6000-48gb": (49_140, "sm86"),
    "b200-180gb": (183_359, "sm100"),
    "mi300x-192gb": (196_592, "gfx942"),
}


def test_the_catalog_holds_the_added_cards():
    gpus, _ = gpu_catalog()
    for key, (mib, arch) in ADDED.items():
        assert (gpus[key].memory, gpus[key].arch) == (mib * MIB, arch), key
    assert gpus["mi300x-192gb"].memory == 206_141_652_992  # rocm-smi's VRAM Total Memory (B)


def test_per_arch_constants_fall_back_to_the_default():
    gpus, _ = gpu_catalog()
    # Hopper (9.0): 32,768 KiB cuBLAS + 1,024 KiB cuBLASLt per GEMM thread
    assert gpus["h100-80gb"].workspace == (32_768 + 1_024) * 1024
    # Blackwell (sm100) is not 9.0: the default :4096:2:16:8 = 2 x 4,096 + 8 x 16 = 8,320 KiB, + 1,024 KiB
    assert gpus["b200-180gb"].workspace == gpus["v100-16gb"].workspace == (8_320 + 1_024) * 1024
    # MI300X (gfx942): hipBLAS 128 MiB + hipBLASLt 76 MiB = 131,072 + 77,824 KiB
    assert gpus["mi300x-192gb"].workspace == (131_072 + 77_824) * 1024
    assert all(g.gemm_threads == 2 for g in gpus.values())
    names = [c.name for c in catalog_constants(gpus["b200-180gb"], 1)]
    assert "specs/gpus.yaml allocator.cublas_workspace_kib (default, for sm100)" in names


def test_every_catalog_gpu_gives_a_verdict():
    gpus, _ = gpu_catalog()
    for key, gpu in gpus.items():
        r = api.estimate(TINY, gpu=key)
        assert r.gpu == gpu and r.fits is True, key  # 875,560,960 B fits every card, the smallest 15.78 GiB


def test_unknown_names_suggest_the_catalog(capsys):
    assert main(["estimate", TINY, "--gpu", "mi300x"]) == 2
    assert "E503 --gpu: unknown GPU 'mi300x'\nhelp: did you mean 'mi300x-192gb'?" in capsys.readouterr().err


def test_a_gpu_given_by_its_memory_is_the_default_gpu_with_that_memory():
    """--gpu 81559MiB is the catalog's H100 80GB HBM3 (the default GPU, sm90) but for its name."""
    by_name, by_size = api.estimate(FINETUNE, gpu="h100-80gb"), api.estimate(FINETUNE, gpu="81559MiB")
    assert by_size.gpu.memory == by_name.gpu.memory == 85_520_809_984 and by_size.gpu.key == "81559MiB"
    assert (by_size.gpu.arch, by_size.gpu.workspace) == (by_name.gpu.arch, by_name.gpu.workspace) == ("sm90", (32_768 + 1_024) * 1024)
    assert by_size.device == by_name.device and by_size.fits == by_name.fits
    assert api.estimate(TINY, gpu="80GB").gpu.memory == 80_000_000_000


def test_the_verdict_keeps_the_margin_free():
    """A GPU of exactly the device figure + 1 GiB: a 1 GiB margin leaves the device figure
    itself (fits); one byte more does not."""
    device = api.estimate(TINY).device
    gpu = f"{device + 2**30}B"  # 875,560,960 + 1,073,741,824 = 1,949,302,784 B
    fits = api.estimate(TINY, gpu=gpu, margin="1GiB")
    assert fits.device == device and fits.budget == device and fits.fits is True
    tight = api.estimate(TINY, gpu=gpu, margin=f"{2**30 + 1}B")
    assert tight.budget == device - 1 and tight.fits is False
    assert tight.gpu.memory - tight.device == 2**30  # a positive headroom, less than the margin


def test_fail_if_oom_exit_codes(capsys):
    assert main(["estimate", TINY, "--gpu", "h100-80gb", "--fail-if-oom"]) == 0
    assert main(["estimate", FINETUNE, "--gpu", "24GiB", "--fail-if-oom"]) == EXIT_DOES_NOT_FIT == 4
    out = capsys.readouterr().out
    assert "gpu       24GiB (custom GPU, h100-80gb's sm90 constants, 24.00 GiB): does NOT fit" in out  # printed all the same
    assert main(["estimate", FINETUNE, "--gpu", "24GiB"]) == 0  # without the flag, a verdict is no failure
    capsys.readouterr()
    assert main(["estimate", TINY, "--fail-if-oom"]) == 2
    assert "E201 --gpu: --fail-if-oom needs a GPU to fit" in capsys.readouterr().err


def test_allocated_counts_the_blocks_the_allocator_does_not_split():
    """torch.cuda.max_memory_allocated() counts the allocator's blocks: a cached large-pool
    block is handed out whole when 1 MiB or less would remain. Flan-T5-base at micro-batch 8,
    checkpointed, on the H200: the GPU's max_memory_allocated is 5,580,512,768 B; the
    estimate's tensors peak at 5,418,974,208 B (-2.89 %; the step's own GPU history's requests
    peak at 5.04 GiB too), its replay's blocks at 5,569,117,184 B (-0.20 %; each dropout's
    mask made before its output, as CUDA's native_dropout does; the encoder lookup's gradient
    added into the decoder lookup's sum in place, as the step's GPU history does: 1 MiB less
    than with a sum of its own). A GPU record is
    compared with the blocks, a trace (the tensors' bytes) with the tensors."""
    path = MEASURED / "gpu" / "t5_base_b8_s1024_t128_gc-on.json"
    record = json.loads(path.read_text())
    assert record["allocated"] == 5_580_512_768
    (c,) = validate_records([path])
    report, _ = record_report(path)
    assert (report.tensors, report.allocated) == (5_418_974_208, 5_569_117_184)
    assert c.estimated["allocated"] == report.allocated
    assert -2.95 < 100 * (report.tensors - record["allocated"]) / record["allocated"] < -2.85
    assert abs(c.error("allocated")) < 0.21
    (traced,) = validate_records([MEASURED / "cpu-trace" / "t5_base_b8_s1024_t128_gc-on.json"])
    assert traced.estimated["allocated"] == report.tensors


def test_masked_sdpa_runs_cudnn_attention_on_hopper_and_not_on_an_a100():
    """Phi-3-mini-4k LoRA r16, b 1, seq 2048, sdpa with its sliding-window mask. On the H200 the
    step ran cuDNN attention (its GPU history: 8 B philox tensors on the device, the output laid
    out like Phi-3's contiguous q), so each of the 32 layers' o_proj adapter saved a copy of the
    output, 1 * 2048 * 3072 * 2 = 12,582,912 B: the GPU's max_memory_allocated, 18,665,907,712 B,
    is within 0.02 % of the estimate. An A100 runs the memory-efficient kernel, whose output
    o_proj reads as it is: 32 copies less (402,653,184 B)."""
    path = MEASURED / "gpu" / "phi3-lora_mini-4k_b1_s2048_sdpa_gc-off.json"
    record = json.loads(path.read_text())
    (c,) = validate_records([path])
    assert record["allocated"] == 18_665_907_712 and abs(c.error("allocated")) < 0.02
    report, _ = record_report(path)
    exp = {k: v for k, v in record["experiment"].items() if k not in ("experiment", "model", "gpu", "parallel", "lora")}
    exp.pop("images_per_sample")
    lora = {k: record["experiment"]["lora"][k] for k in ("r", "alpha", "target_modules")}
    a100 = api.estimate(record["experiment"]["model"], **exp, lora=lora, gpu="a100-80gb")
    h200 = api.estimate(record["experiment"]["model"], **exp, lora=lora, gpu="h200-141gb")
    assert h200.tensors == report.tensors
    # + the two GEMM threads' cuBLAS workspaces, 32 MiB on Hopper and 8,320 KiB before it
    assert h200.tensors - a100.tensors == 32 * 2048 * 3072 * 2 + 2 * (32_768 - 8_320) * 1024 == 452_722_688


def test_a_default_gpu_the_catalog_lacks_is_refused_at_its_line(tmp_path, monkeypatch):
    """specs/gpus.yaml's default_gpu names a catalog key; one it lacks (a typo, or every GPU
    removed) ended in a KeyError (internal error) before."""
    from compiler import paths
    from compiler.errors import MemspecError
    from compiler.pipeline import gpus

    text = (ROOT / "specs" / "gpus.yaml").read_text()
    (tmp_path / "gpus.yaml").write_text(text.replace("default_gpu: h100-80gb", "default_gpu: h100-80gib"))
    monkeypatch.setattr(paths, "specs_dir", lambda: tmp_path)
    gpus._catalog.cache_clear()
    gpus.gpu_catalog.cache_clear()
    try:
        with pytest.raises(MemspecError) as err:
            gpus.gpu_catalog()
    finally:
        monkeypatch.undo()
        gpus._catalog.cache_clear()
        gpus.gpu_catalog.cache_clear()
    (d,) = err.value.diagnostics
    line = 1 + text.splitlines().index("default_gpu: h100-80gb")
    assert (d.code, d.line, d.path) == ("E208", line, "$.default_gpu")
    assert d.message == "default_gpu 'h100-80gib' is not in the catalog" and "h100-80gb" in d.help
