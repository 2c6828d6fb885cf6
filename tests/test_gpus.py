"""The GPU catalog (specs/gpus.yaml): every card estimates, with its architecture's constants."""

from pathlib import Path

import pytest

from compiler import api
from compiler.cli import main
from compiler.pipeline.resolve import MIB, catalog_constants, gpu_catalog

ROOT = Path(__file__).resolve().parent.parent
TINY = "tests/measured/tiny/tiny-finetune.yaml"  # device 875,560,960 B: reserved 75,497,472 + CUDA context 800,063,488


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


# nvidia-smi's memory.total (MiB) and the architecture of each added card
ADDED = {"v100-16gb": (16_160, "sm70"), "v100-32gb": (32_510, "sm70"), "l4-24gb": (23_034, "sm89"),
         "rtx3090-24gb": (24_576, "sm86"), "rtxa6000-48gb": (49_140, "sm86"), "b200-180gb": (183_359, "sm100"),
         "mi300x-192gb": (196_592, "gfx942")}


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


def test_every_catalog_gpu_estimates():
    gpus, _ = gpu_catalog()
    for key, gpu in gpus.items():
        r = api.estimate(TINY, gpu=key)
        assert r.gpu == gpu and r.device <= gpu.memory, key  # 875,560,960 B fits every card, the smallest 15.78 GiB


def test_unknown_names_suggest_the_catalog(capsys):
    assert main(["estimate", TINY, "--gpu", "mi300x"]) == 2
    assert "E503 --gpu: unknown GPU 'mi300x'\nhelp: did you mean 'mi300x-192gb'?" in capsys.readouterr().err

