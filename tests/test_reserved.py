"""The estimate's reserved figure: two steps replayed through the caching allocator model."""

from pathlib import Path

from compiler import api
from compiler.pipeline.render import as_data, text

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ROOT / "specs" / "experiments" / "llava-1.5-7b-pretrain.yaml"


def test_reserved_holds_the_allocated_peak_in_every_golden_case():
    rows = (ROOT / "tests" / "golden" / "SUMMARY.tsv").read_text().splitlines()
    head = rows[0].split("\t")
    assert head[:3] == ["case", "allocated", "reserved"]
    for row in rows[1:]:
        case, allocated, reserved = row.split("\t")[:3]
        assert int(reserved) >= int(allocated), case


def test_expandable_segments_fragment_less():
    default = api.estimate(PRETRAIN, dp=1, zero=0)
    expandable = api.estimate(PRETRAIN, dp=1, zero=0, alloc_conf="expandable_segments:True")
    assert expandable.allocated == default.allocated  # the settings move segments, not tensors
    assert default.allocated <= expandable.reserved < default.reserved


def test_an_allocation_that_fails_on_the_gpu_is_reported():
    report = api.estimate(PRETRAIN, dp=1, zero=0, gpu="a10g-24gb")
    oom = report.estimate.oom
    assert oom is not None
    assert oom.reserved + oom.requested > oom.capacity
    assert report.device > report.gpu.memory  # the figure is what the step would need
    shown = text(report)
    assert "does NOT fit" in shown and "CUDA out of memory at allocation" in shown
    data = as_data(report)
    assert data["gpu"]["fits"] is False and data["gpu"]["out_of_memory"]["requested"] == oom.requested
    roomy = api.estimate(PRETRAIN, dp=1, zero=0, gpu="h200-141gb")
    assert roomy.estimate.oom is None and as_data(roomy)["gpu"]["fits"] is True


def test_the_settings_are_shown():
    report = api.estimate(PRETRAIN, dp=1, zero=0, alloc_conf="expandable_segments:True")
    assert "allocator PYTORCH_CUDA_ALLOC_CONF: expandable_segments:True" in text(report)
    assert as_data(report)["allocator"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
