"""`memspec sweep`: every row is the estimate at its point, in every output form.

The expected figures come from `compiler.api.estimate` with the point's overrides written out
by hand here (checkpointing `on` is the experiment's `[language]`, a LoRA rank keeps the
experiment's `lora` block), never from the sweep's own conversion.
"""

import csv
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from compiler.api import estimate
from compiler.cli import main
from compiler.commands.sweep import ProgressBar, parse_values

ROOT = Path(__file__).resolve().parent.parent
FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"  # gradient_checkpointing: [language], dp 8, ZeRO-3
LORA = "specs/experiments/llava-1.5-7b-lora.yaml"  # lora: r 128, alpha 256 on the language model
SPEC = "specs/qwen2/qwen2.5-0.5b.yaml"  # a bare spec: everything trainable, bf16-mixed AdamW
HUB = ROOT / "tests" / "fixtures" / "hub" / "Llama-3.2-1B"  # a model folder, imported in memory
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def _run(capsys, *argv: str) -> str:
    assert main(["sweep", *argv, "--quiet"]) == 0
    return capsys.readouterr().out


def _expected(path, gpu: str | None = None, **overrides):
    r = estimate(path, gpu=gpu, **overrides) if gpu else estimate(path, **overrides)
    out = {
        "allocated": r.allocated,
        "reserved": r.reserved,
        "device": r.device,
        "first_step": r.estimate.allocated_first_step,
        "peak_phase": r.estimate.peak.phase,
        "peak_layer": r.estimate.peak.path,
    }
    if r.gpu is not None:
        # the verdict keeps the margin free: the catalog's 0.5 % of the GPU's memory
        out.update(fits=r.device <= r.gpu.memory - r.margin.reserve(r.gpu.memory) and r.estimate.oom is None, headroom=r.gpu.memory - r.device)
    return out


def test_values_and_ranges():
    assert parse_values("seq_len", "1024:8192:x2") == [1024, 2048, 4096, 8192]
    assert parse_values("seq_len", "1024:5000:x2") == [1024, 2048, 4096]  # the stop is a bound, not a value
    assert parse_values("micro_batch", "1:16:+4") == [1, 5, 9, 13]
    assert parse_values("micro_batch", "1:13:4") == [1, 5, 9, 13]
    assert parse_values("micro_batch", "1:3") == [1, 2, 3]
    assert parse_values("micro_batch", "4,2,4,1:2") == [4, 2, 1]  # order kept, duplicates dropped
    assert parse_values("zero", "0,3") == [0, 3]
    assert parse_values("gradient_checkpointing", "On,off,language+vision") == ["on", "off", "language+vision"]
    assert parse_values("lora_rank", "off,8,16") == ["off", 8, 16]


def test_every_csv_row_is_the_estimate_at_its_point(capsys, tmp_path):
    out = tmp_path / "sweep.csv"
    assert (
        main(
            [
                "sweep",
                FINETUNE,
                "--micro-batch",
                "1,4",
                "--seq-len",
                "1024:2048:x2",
                "--zero",
                "2,3",
                "--gradient-checkpointing",
                "on,off",
                "--gpu",
                "h100-80gb",
                "-o",
                str(out),
                "--quiet",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == ""  # -o takes the rows; the format follows its extension
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert list(rows[0]) == [
        "micro_batch",
        "seq_len",
        "zero",
        "gradient_checkpointing",
        "allocated",
        "reserved",
        "device",
        "first_step",
        "peak_phase",
        "peak_layer",
        "fits",
        "headroom",
    ]
    points = [(b, s, z, gc) for b in (1, 4) for s in (1024, 2048) for z in (2, 3) for gc in ("on", "off")]
    assert [(int(r["micro_batch"]), int(r["seq_len"]), int(r["zero"]), r["gradient_checkpointing"]) for r in rows] == points
    for row, (b, s, z, gc) in zip(rows, points):
        want = _expected(FINETUNE, "h100-80gb", micro_batch=b, seq_len=s, zero=z, gradient_checkpointing=["language"] if gc == "on" else [])
        got = {k: row[k] for k in want}
        for k in ("allocated", "reserved", "device", "first_step", "headroom"):
            got[k] = int(got[k])
        got["fits"] = {"true": True, "false": False}[got["fits"]]
        assert got == want, (b, s, z, gc)
    # checkpointing changes the peak somewhere in the grid, or the knob would not reach the estimate
    assert {r["allocated"] for r in rows if r["gradient_checkpointing"] == "on"} != {r["allocated"] for r in rows if r["gradient_checkpointing"] == "off"}


def test_json_rows_lora_ranks(capsys):
    data = json.loads(_run(capsys, LORA, "--lora-rank", "off,8,64", "--micro-batch", "2", "--format", "json"))
    assert data["schema"] == "memspec/sweep/v1"
    assert data["knobs"] == {"micro_batch": [2], "lora_rank": ["off", 8, 64]}
    # the experiment's gpu:, 40 GiB = 42,949,672,960 B; the experiment checkpoints, so the
    # catalog's checkpointed margin, 4 % of it = 1,717,986,918.4 B, rounded up to
    # 1,717,986,919 B kept free: a device figure up to 41,231,686,041 B fits
    assert data["gpu"] == {
        "key": "a100-40gb",
        "memory": 40 * 2**30,
        "budget": 41_231_686_041,
        "margin": {
            "percent": 4,
            "bytes": 1_717_986_919,
            "source": "specs/gpus.yaml device.margin_pct.checkpointed",
            "summary": "the worst under-estimate measured on a GPU for a checkpointed step",
        },
    }
    assert [r["lora_rank"] for r in data["rows"]] == ["off", 8, 64]
    for row in data["rows"]:
        lora = None if row["lora_rank"] == "off" else {"r": row["lora_rank"]}
        want = _expected(LORA, micro_batch=2, lora=lora)
        assert {k: row[k] for k in want} == want
    assert len({r["allocated"] for r in data["rows"]}) == 3


def test_bare_spec_and_model_folder(capsys):
    data = json.loads(_run(capsys, SPEC, "--micro-batch", "1,2", "--seq-len", "512", "--dp", "1,2", "--zero", "2", "--format", "json"))
    assert data["gpu"] is None
    for row in data["rows"]:
        assert "fits" not in row  # no GPU, no verdict
        want = _expected(SPEC, micro_batch=row["micro_batch"], seq_len=512, dp=row["dp"], zero=2)
        assert {k: row[k] for k in want} == want
    rows = list(csv.DictReader(io.StringIO(_run(capsys, str(HUB), "--micro-batch", "1,2", "--seq-len", "1024", "--format", "csv"))))
    from compiler.inputs.importer import source_inputs
    from compiler.api import run

    for row in rows:
        r = run(*source_inputs(str(HUB), {"micro_batch": int(row["micro_batch"]), "seq_len": 1024}))
        assert int(row["allocated"]) == r.allocated and int(row["device"]) == r.device


def test_text_form(capsys):
    text = _run(capsys, FINETUNE, "--micro-batch", "1,8", "--seq-len", "4096", "--gpu", "h100-80gb")
    lines = text.splitlines()
    assert lines[0].startswith("memspec sweep: llava-1.5-7b-finetune") and "2 points" in lines[0]
    assert lines[2].split()[:4] == ["micro", "batch", "seq", "len"]
    r = estimate(FINETUNE, micro_batch=8, seq_len=4096, gpu="h100-80gb")
    assert f"{r.allocated / 2**30:.2f}" in lines[4] and f"{r.estimate.peak.phase} at {r.estimate.peak.path}" in lines[4]


def test_svg_chart(capsys, tmp_path):
    svg = tmp_path / "chart.svg"
    _run(
        capsys,
        FINETUNE,
        "--micro-batch",
        "1,4,16",
        "--seq-len",
        "1024:4096:x2",
        "--zero",
        "2,3",
        "--gpu",
        "a100-40gb",
        "--svg",
        str(svg),
        "--x",
        "seq-len",
        "--format",
        "csv",
    )
    root = ET.parse(svg).getroot()
    assert root.tag == SVG + "svg"
    capacity = [e for e in root.iter(SVG + "line") if e.get("class") == "capacity"]
    assert len(capacity) == 1 and "a100-40gb" in capacity[0].find(SVG + "title").text
    assert capacity[0].get("y1") == capacity[0].get("y2")  # horizontal
    series = [g for g in root.iter(SVG + "g") if g.get("class") == "series"]
    assert len(series) == 6  # 3 micro-batches x 2 ZeRO stages, one line each
    assert sorted(g.find(SVG + "title").text for g in series)[0] == "micro-batch 1, zero 2"
    assert all(len(g.findall(SVG + "circle")) == 3 for g in series)  # 3 sequence lengths per line
    legend = [t.text for t in root.iter(SVG + "text") if t.get("class") == "legend"]
    assert len(legend) == 6
    # a point above the capacity line is drawn above it (smaller y): micro-batch 16, seq 4096 on 40 GB
    big = estimate(FINETUNE, micro_batch=16, seq_len=4096, zero=2, gpu="a100-40gb")
    assert big.device > big.gpu.memory
    point = next(
        c
        for g in series
        if g.find(SVG + "title").text == "micro-batch 16, zero 2"
        for c in g.findall(SVG + "circle")
        if c.find(SVG + "title").text.endswith(f"seq-len 4096: {big.device:,} B ({big.device / 2**30:.2f} GiB)")
    )
    assert float(point.get("cy")) < float(capacity[0].get("y1"))


def test_svg_without_gpu_draws_the_default_gpu(capsys, tmp_path):
    svg = tmp_path / "chart.svg"
    _run(capsys, SPEC, "--micro-batch", "1,2", "--seq-len", "512", "--svg", str(svg))
    capacity = [e for e in ET.parse(svg).getroot().iter(SVG + "line") if e.get("class") == "capacity"]
    assert len(capacity) == 1 and "(default GPU)" in capacity[0].find(SVG + "title").text


@pytest.mark.parametrize(
    "argv, code, words",
    [
        (["--micro-batch", "0,1"], "E913", "below the smallest micro batch, 1"),
        (["--micro-batch", "two"], "E911", "'two' in 'two' is not an integer"),
        (["--seq-len", "1024,,2048"], "E911", "empty value"),
        (["--seq-len", "1024:8192:x"], "E911", "'' in '1024:8192:x' is not an integer"),
        (["--seq-len", "1:2:3:4"], "E911", "is not a range"),
        (["--seq-len", "8192:1024:x2"], "E912", "runs backwards"),
        (["--seq-len", "1024:8192:x1"], "E912", "factor >= 2"),
        (["--micro-batch", "1:100000"], "E912", "more than 10,000 values"),
        (["--micro-batch", "1:200", "--seq-len", "1024:1124"], "E912", "20,200 points (200 micro-batch x 101 seq-len)"),
        (["--zero", "0,4"], "E913", "'4' is not one of 0, 1, 2, 3"),
        (["--attention", "sdp"], "E913", "did you mean 'sdpa'?"),
        (["--gradient-checkpointing", "on,language+"], "E913", "neither on, off nor modules"),
        (["--gradient-checkpointing", "lang"], "E304", "unknown module 'lang'; sweep point gradient-checkpointing lang"),
        (["--seq-len", "512,1024"], "E501", "(1 x 576 = 576); sweep point seq-len 512"),
        (["--lora-rank", "off,0"], "E913", "below the smallest lora rank"),
        (["--micro-batch", "1,2", "--x", "dp", "--svg", "c.svg"], "E914", "'dp' is not a swept knob"),
        (["--micro-batch", "1", "--svg", "c.svg"], "E914", "two or more values"),
    ],
)
def test_bad_values(capsys, argv, code, words):
    assert main(["sweep", FINETUNE, *argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert code in err and words in err and "Traceback" not in err
    assert not Path("c.svg").exists()


def test_progress_bar():
    stream = io.StringIO()
    bar = ProgressBar(stream)
    bar(0, 4, {"micro_batch": 1})
    bar(2, 4, {"micro_batch": 4})
    bar(4, 4, {})
    frames = stream.getvalue().split("\r")
    assert frames[1].startswith("[" + "." * 30 + "] 0/4 micro-batch 1")
    assert frames[2].startswith("[" + "#" * 15 + "." * 15 + "] 2/4 micro-batch 4")
    assert frames[-1] == ""  # cleared at the end


def test_no_progress_bar_when_stderr_is_not_a_terminal(capsys):
    assert main(["sweep", SPEC, "--micro-batch", "1,2", "--seq-len", "512"]) == 0
    assert capsys.readouterr().err == ""


def test_choices_are_the_estimators():
    from compiler.pipeline.resolve import ATTENTION, PRECISION_NAMES
    from compiler.commands.sweep import BY_NAME

    assert BY_NAME["attention"].choices == tuple(ATTENTION)
    assert sorted(BY_NAME["precision"].choices) == sorted(PRECISION_NAMES)


def test_a_sweep_over_checkpointing_keeps_each_points_margin(capsys):
    """The catalog's margin depends on the kind of step: each point is judged with its own
    (checkpointed 4 %, plain 2 %), the JSON gives each point's budget and the text names both."""
    tiny = "tests/measured/tiny/tiny-finetune.yaml"
    data = json.loads(_run(capsys, tiny, "--gradient-checkpointing", "on,off", "--gpu", "h100-80gb", "--format", "json"))
    h100 = 81_559 * 2**20  # 85,520,809,984 B
    # 4 % of it rounds up to 3,420,832,400 B kept free; 2 % to 1,710,416,200 B
    assert [(r["gradient_checkpointing"], r["budget"]) for r in data["rows"]] == [("on", h100 - 3_420_832_400), ("off", h100 - 1_710_416_200)]
    text = _run(capsys, tiny, "--gradient-checkpointing", "on,off", "--gpu", "h100-80gb")
    assert "margins by kind of step: 4 % = 3.19 GiB kept free (specs/gpus.yaml device.margin_pct.checkpointed:" in text
    assert "; 2 % = 1.59 GiB kept free (specs/gpus.yaml device.margin_pct: " in text
