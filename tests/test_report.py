"""`memspec report`: the HTML page read back with html.parser. Every figure on it equals the
one `memspec estimate --format json` gives (and the layer table `memspec table --format
json`); the charts are drawn to those figures; the page fetches nothing."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from compiler import api
from compiler.cli import _inputs, parser
from compiler.commands.html_report import MIN_PHASE_SHARE, _axis, html, size
from compiler.pipeline.resolve import gpu_catalog
from reportpage import Page, cli, estimate_json, exact_bytes, keyed_values, layer_rows, required_keys, table_json, typed_cell

GIB = 1 << 30
MIB = 1 << 20
FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"
LAUNCH = "tests/fixtures/launch/scripts"
HUB = "tests/fixtures/hub"
CASES = {
    # dp 8, ZeRO-3 (the recipe), fits an H100
    "finetune-h100": [FINETUNE, "--gpu", "h100-80gb"],
    # micro-batch 32 at ZeRO-2: 54.62 GiB allocated, far over an A10G's 22.49 GiB
    "pretrain-a10g": ["specs/experiments/llava-1.5-7b-pretrain.yaml", "--gpu", "a10g-24gb"],
    # a tiny model, no --gpu: the axis is in MiB, no capacity line
    "tiny": ["tests/measured/tiny/tiny-finetune.yaml"],
    # a bare spec with flags: LoRA on the language model, checkpointing
    "lora-flags": [
        "specs/llava/llava-1.5-7b.yaml",
        "--micro-batch",
        "2",
        "--seq-len",
        "1024",
        "--lora-r",
        "16",
        "--gradient-checkpointing",
        "language",
        "--gpu",
        "a100-40gb",
    ],
    # the launch script's notes reach the page
    "from-command": ["--from-command", f"{LAUNCH}/v1_5/finetune.sh", "specs/llava/llava-1.5-7b.yaml", "--dp", "8"],
    # a model folder imported in memory: the import's notes reach the page
    "hub-folder": [f"{HUB}/Qwen2.5-0.5B", "--micro-batch", "2", "--seq-len", "1024", "--gpu", "l40s-48gb"],
}


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def case(request, tmp_path_factory):
    args = CASES[request.param]
    out = tmp_path_factory.mktemp(request.param) / "report.html"
    code, stdout, stderr = cli("report", *args, "-o", str(out))
    assert code == 0, stderr
    text = out.read_text(encoding="utf-8")
    return {
        "name": request.param,
        "args": args,
        "html": text,
        "page": Page(text),
        "stdout": stdout,
        "stderr": stderr,
        "data": estimate_json(args),
        "table": table_json(args),
    }


def test_every_figure_equals_the_estimate_json(case):
    shown = keyed_values(case["page"], case["data"])
    missing = required_keys(case["data"]) - set(shown)
    assert not missing, f"figures the page does not show: {sorted(missing)}"
    for key, pairs in shown.items():
        for got, expected in pairs:
            assert got == expected, key


def test_breakdown_reads_in_gib_with_the_exact_bytes_beside(case):
    """The breakdown table's cells read as the text view does (GiB, MiB below 1 GiB); the exact
    bytes are the cell's data-bytes and its title."""
    page, breakdown = case["page"], case["data"]["peak"]["steady_state"]["breakdown"]
    for el in page.elements:
        key = el.attrs.get("data-key", "")
        if key.startswith("peak.steady_state.breakdown."):
            module, category = key.split(".")[-2:]
            value = breakdown[module][category]
            assert (el.text, int(el.attrs["data-bytes"]), exact_bytes(el.attrs["title"])) == (size(value), value, value), key


def test_headline_cards_round_as_the_text_view(case):
    """The big figure of each card is the exact one in GiB (2 decimals), as `memspec estimate` prints it."""
    page, peak = case["page"], case["data"]["peak"]
    cards = {el.attrs["id"]: el for el in page.find("div", cls="card")}
    for card, value in (
        ("card-allocated", peak["allocated"]),
        ("card-reserved", peak["reserved"]),
        ("card-device", peak["device"]),
        ("card-first-step", peak["allocated_first_step"]),
    ):
        (figure,) = [el for el in page.inside(cards[card], "div") if "gib" in el.classes]
        assert figure.text == size(value), card


def test_verdict_says_fits_or_not(case):
    gpu = case["data"]["gpu"]
    verdicts = case["page"].find("p", cls="verdict")
    if gpu is None:
        assert not verdicts
        return
    (verdict,) = verdicts
    # fits: the device figure leaves at least the margin free (and the replay never ran out)
    assert ("fits" in verdict.classes) == gpu["fits"] == (gpu["headroom"] >= gpu["margin"]["bytes"] and gpu["out_of_memory"] is None)
    assert verdict.text.startswith("Fits on" if gpu["fits"] else "Does NOT fit on")


def test_fits_and_does_not_fit_are_both_covered(case):
    # 32.14 GiB allocated / 33.40 GiB device on an 79.65 GiB H100; 55.63 GiB device on a 22.49 GiB A10G
    expected = {"finetune-h100": True, "pretrain-a10g": False}
    if case["name"] in expected:
        assert case["data"]["gpu"]["fits"] is expected[case["name"]]


def test_layer_table_equals_the_table_json(case):
    rows = layer_rows(case["page"])
    assert len(rows) == len(case["table"]) > 0
    for shown, expected in zip(rows, case["table"]):
        columns = set(expected) - {"depth", "module"}  # depth is the path's indent, module its first name
        assert set(shown) == columns
        for column in columns:
            assert typed_cell(shown[column], expected[column]) == expected[column], (expected["path"], column)


def test_the_page_fetches_nothing(case):
    page = case["page"]
    for tag in ("script", "link", "img", "iframe", "object", "embed", "base"):
        assert not page.find(tag), tag
    for el in page.elements:
        for name, value in el.attrs.items():
            assert "://" not in (value or ""), (el.tag, name, value)
            assert not name.startswith("on"), (el.tag, name)
    (style,) = page.find("style")
    assert "url(" not in style.text and "@import" not in style.text
    assert not re.search(r"https?://", case["html"])


def test_sections(case):
    page = case["page"]
    ids = [el.attrs["id"] for el in page.find("section")]
    assert ids == ["headline", "breakdown", "timeline", "layers", "assumptions"]
    assert [el.text for el in page.find("h2")] == [
        "Peak GPU memory per GPU",
        "Where the memory goes at the peak",
        "The step, event by event",
        "Layer table",
        "Assumptions",
    ]


def _bars(page: Page) -> dict[str, dict[str, tuple[float, float, int]]]:
    """module -> category -> (x, width, exact bytes), from the stacked bars' rects and titles."""
    out: dict = {}
    for rect in page.find("rect"):
        category = next((c[len("fill-") :] for c in rect.classes if c.startswith("fill-")), None)
        if category is None:
            continue
        m = re.fullmatch(r"(\S+) · (.+?): .* \((-?[0-9,]+ B)\)", rect.text)
        assert m, rect.text
        assert m.group(2) == category.replace("_", " ")
        out.setdefault(m.group(1), {})[category] = (float(rect.attrs["x"]), float(rect.attrs["width"]), exact_bytes(m.group(3)))
    return out


def test_stacked_bars_are_the_breakdown(case):
    breakdown = case["data"]["peak"]["steady_state"]["breakdown"]
    bars = _bars(case["page"])
    drawn = {m: cats for m, cats in breakdown.items() if sum(cats.values())}
    assert list(bars) == list(drawn)
    scale = None
    for module, cats in drawn.items():
        assert {c: b for c, (_, _, b) in bars[module].items()} == {c: v for c, v in cats.items() if v}
        segments = sorted(bars[module].values())
        for (x0, w0, _), (x1, _, _) in zip(segments, segments[1:]):
            assert x1 == pytest.approx(x0 + w0, abs=0.6)  # stacked end to end (a sliver is drawn 0.5 wide)
        length = sum(w for _, w, b in segments if b)
        per_byte = length / sum(cats.values())
        scale = scale or per_byte
        # one scale for every bar: lengths in proportion to the rows' totals
        assert per_byte == pytest.approx(scale, rel=0.02, abs=4 / sum(cats.values()))


def _points(d: str) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"(-?[0-9.]+),(-?[0-9.]+)", d)]


def _y_scale(page: Page) -> tuple[float, float]:
    """(y of 0 bytes, SVG units per byte) from the axis ticks."""
    unit = {"GiB": GIB, "MiB": MIB}[re.fullmatch(r"allocated \((\w+)\)", page.find("text", cls="axis-title")[0].text).group(1)]
    ticks = [(float(line.attrs["y1"]), float(text.text) * unit) for line, text in zip(page.find("line", cls="grid"), page.find("text", cls="tick"))]
    (y0, v0), (y1, v1) = ticks[0], ticks[-1]
    assert v0 == 0 and v1 > 0
    return y0, (y0 - y1) / v1


def test_timeline_peak_is_marked_at_the_curves_highest_point(case):
    page, data = case["page"], case["data"]
    line = _points(page.one("path", cls="line").attrs["d"])
    peak = page.one("circle", cls="peak")
    top = min(y for _, y in line)  # SVG y grows downwards
    assert float(peak.attrs["cy"]) == top
    xs = [x for x, y in line if y == top]
    assert min(xs) <= float(peak.attrs["cx"]) <= max(xs)
    y0, per_byte = _y_scale(page)
    # NB: the timeline is of the tensors; the peak's allocated adds the blocks' unsplit remainders
    steady = data["peak"]["steady_state"]
    assert float(peak.attrs["cy"]) == pytest.approx(y0 - steady["allocated"] * per_byte, abs=0.06)
    assert page.one("text", cls="peak-label").text == f"peak {size(steady['allocated'])}: {steady['phase']} at {steady['layer']}"


def test_timeline_capacity_and_seed_lines(case):
    page, data = case["page"], case["data"]
    y0, per_byte = _y_scale(page)
    seed = page.one("line", cls="seed")
    assert float(seed.attrs["y1"]) == pytest.approx(y0 - data["seed_sum"] * per_byte, abs=0.06)
    capacity = page.find("line", cls="capacity")
    if data["gpu"] is None:
        assert not capacity
        return
    (capacity,) = capacity
    assert float(capacity.attrs["y1"]) == pytest.approx(y0 - data["gpu"]["memory"] * per_byte, abs=0.06)
    assert page.one("text", cls="capacity-label").text == f"{data['gpu']['key']} capacity: {size(data['gpu']['memory'])}"
    # the curve is allocated memory: it stays under the line exactly when allocated fits the capacity
    assert (float(capacity.attrs["y1"]) <= float(page.one("circle", cls="peak").attrs["cy"])) == (data["peak"]["allocated"] <= data["gpu"]["memory"])


def test_timeline_phases_in_step_order(case):
    page = case["page"]
    assert [t.text for t in page.find("text", cls="band-label")] == ["forward", "loss", "backward", "optimizer step"]
    bands = page.find("rect", cls="band")
    assert [b.attrs["class"] for b in bands] == ["band band-forward", "band band-loss", "band band-backward", "band band-optimizer"]
    for a, b in zip(bands, bands[1:]):
        assert float(b.attrs["x"]) == pytest.approx(float(a.attrs["x"]) + float(a.attrs["width"]), abs=0.11)


def test_not_modelled_and_notes(case):
    page, data = case["page"], case["data"]
    listed = page.one(id="not-modelled")
    if data["not_modelled"]:
        assert [li.text for li in page.inside(listed, "li")] == data["not_modelled"]
    else:
        assert listed.text == "Nothing this setup uses is listed as not modelled."
    notes = [li.text for li in page.inside(page.one("ul", id="notes"), "li")]
    printed = [line for line in case["stderr"].splitlines() if line.startswith(("note: ", "warning: "))]
    assert notes[2 : 2 + len(printed)] == printed  # after the lines on the GPU assumed and on what checks the formulas
    if case["name"] == "from-command":
        assert printed and printed[0].startswith(f"note: {LAUNCH}/v1_5/finetune.sh:")
    target = data["target_gpu"]
    assert f"{target['key']} ({target['arch']})" in notes[0]
    spec_notes = _inputs(parser().parse_args(["estimate", *case["args"]]))[0].doc.data.get("notes") or []
    assert notes[2 + len(printed) :] == [f"model spec: {n}" for n in spec_notes]
    parallel = data["setup"]["parallel"]
    assert ("Only one GPU without sharding is measured" in notes[1]) == (parallel["dp"] > 1 or parallel["zero"] > 0)
    if case["name"] == "hub-folder":
        code, out, _ = cli("import", case["args"][0], "--format", "json")
        assert code == 0 and spec_notes == json.loads(out)["notes"] != []


def test_constants_table(case):
    page, data = case["page"], case["data"]
    table = page.one("table", id="constants")
    names = [row.text for row in page.inside(table, "code")]
    dp, zero = data["setup"]["parallel"]["dp"], data["setup"]["parallel"]["zero"]
    assert "specs/gpus.yaml device.cuda_context_mib" in names
    assert ("specs/gpus.yaml device.nccl_per_communicator_mib" in names) == (dp > 1)
    assert ("zero_optimization.reduce_bucket_size" in names) == (zero > 0)
    assert ("zero_optimization.stage3_prefetch_bucket_size" in names) == (zero == 3)


def test_report_json_is_the_estimate_json(case, tmp_path):
    out = tmp_path / "r.html"
    code, stdout, _ = cli("report", *case["args"], "-o", str(out), "--format", "json")
    assert code == 0
    data = json.loads(stdout)
    assert data["schema"] == "memspec/report/v1"
    assert data["output"] == str(out)
    assert data["bytes"] == out.stat().st_size == len(case["html"].encode("utf-8"))
    assert data["estimate"] == case["data"]


def test_report_text_line(case):
    data = case["data"]
    line = case["stdout"]
    assert line.startswith("wrote ") and f"allocated {data['peak']['allocated'] / GIB:.2f} GiB" in line
    if data["gpu"]:
        assert ("does NOT fit on" in line) == (not data["gpu"]["fits"])


# --- the API the page is built from ---------------------------------------------------------


@pytest.fixture(scope="module")
def finetune():
    return api.estimate(FINETUNE, gpu="h100-80gb")


def test_step_timeline_phases(finetune):
    t = api.step_timeline(finetune)
    assert [s.phase for s in t.segments] == ["forward", "loss", "backward", "optimizer"]
    assert t.segments[0].first == 0 and t.segments[-1].last == len(t.events) - 1
    for a, b in zip(t.segments, t.segments[1:]):
        assert b.first == a.last + 1
    for s in t.segments:
        assert s.high == max(e[2] for e in t.events[s.first : s.last + 1])
    assert t.loss == "language.loss"
    # the loss: its forward ends the forward, its backward starts the backward
    loss = t.segments[1]
    assert [e[:2] for e in t.events[loss.first : loss.last + 1]] == [("forward", "language.loss"), ("backward", "language.loss")]
    assert t.events[t.peak][2] == finetune.tensors == max(s.high for s in t.segments)
    assert t.events[t.peak][:2] == (finetune.estimate.peak.phase, finetune.estimate.peak.path)
    assert all(e[2] < finetune.tensors for e in t.events[: t.peak])  # the first event at the maximum


def test_step_timeline_with_nothing_trainable():
    r = api.estimate(FINETUNE, trainable=[])
    t = api.step_timeline(r)
    # no backward, no optimizer states: the step's optimizer event still closes the timeline
    assert [s.phase for s in t.segments] == ["forward", "loss", "optimizer"]


def test_constants_match_what_the_estimate_used(finetune):
    consts = {c.name: c for c in api.constants(finetune)}
    target = finetune.setup.target
    cublas = consts[f"specs/gpus.yaml allocator.cublas_workspace_kib ({target.arch})"]
    cublaslt = next(c for n, c in consts.items() if n.startswith("specs/gpus.yaml allocator.cublaslt_workspace_kib"))
    threads = next(c for n, c in consts.items() if n.startswith("specs/gpus.yaml allocator.gemm_threads"))
    assert (cublas.value + cublaslt.value) * 1024 == target.workspace
    assert threads.value == target.gemm_threads
    assert consts["specs/gpus.yaml device.cuda_context_mib"].value * MIB == finetune.device_constants.cuda_context
    assert consts["specs/gpus.yaml device.nccl_per_communicator_mib"].value * MIB == finetune.device_constants.nccl_per_communicator
    # device = reserved + CUDA context + NCCL (dp 8): the constants on the page add up to the headline
    assert finetune.device == finetune.reserved + (763 + 512) * MIB  # context 763 MiB (H100, torch 2.11/cu130) + NCCL 512 MiB
    assert consts["zero_optimization.reduce_bucket_size"].value == finetune.setup.deepspeed.reduce_bucket
    assert all(c.source for c in consts.values())


def test_constants_on_another_architecture():
    r = api.estimate(FINETUNE, gpu="a100-80gb", dp=1, zero=0)
    names = [c.name for c in api.constants(r)]
    # sm80 has no entry of its own: the default, said so
    assert "specs/gpus.yaml allocator.cublas_workspace_kib (default, for sm80)" in names
    assert "specs/gpus.yaml device.nccl_per_communicator_mib" not in names
    assert not any(n.startswith("zero_optimization.") for n in names)


def test_layer_types_in_order_of_first_use(finetune):
    types = [f.layer_type for f in api.layer_types(finetune)]
    assert types[0] == "clip_vision_tower" and types[-1] == "causal_lm_loss"
    assert len(types) == len(set(types))
    used = {n.inst.formula.layer_type for root in finetune.nodes for n in root.walk()}
    assert set(types) == used


def test_axis_ticks():
    # 32.14 GiB * 1.05 = 33.75 GiB: steps of 10 GiB give 4 ticks above 0
    top, ticks, unit = _axis(34_508_908_544)
    assert (top, unit) == (40 * GIB, "GiB") and ticks == [i * 10 * GIB for i in range(5)]
    # 69.22 MiB * 1.05 = 72.7 MiB: steps of 20 MiB
    top, ticks, unit = _axis(72_586_240)
    assert (top, unit) == (80 * MIB, "MiB") and len(ticks) == 5


def test_short_phases_are_widened():
    """The optimizer step is 1 event of 1755: it is drawn at least MIN_PHASE_SHARE wide."""
    r = api.estimate(FINETUNE)
    page = Page(html(r))
    bands = {b.attrs["class"].split()[-1]: float(b.attrs["width"]) for b in page.find("rect", cls="band")}
    total = sum(bands.values())
    assert bands["band-optimizer"] / total >= MIN_PHASE_SHARE * 0.99
    assert bands["band-backward"] > bands["band-forward"]  # 1084 events against 668


# --- the command line -------------------------------------------------------------------------


def test_output_to_stdout():
    code, stdout, _ = cli("report", "tests/measured/tiny/tiny-finetune.yaml", "-o", "-")
    assert code == 0
    assert stdout.startswith("<!DOCTYPE html>") and stdout.rstrip().endswith("</html>")


def test_stdout_and_json_together_is_a_usage_error():
    code, _, stderr = cli("report", "tests/measured/tiny/tiny-finetune.yaml", "-o", "-", "--format", "json")
    assert code == 2
    assert stderr.startswith("E902 -o: '-o -' writes the page to stdout")


@pytest.mark.parametrize(
    "where, problem",
    [
        ("missing/report.html", "its folder '{tmp}/missing' does not exist"),
        ("", "is a folder"),
    ],
)
def test_unwritable_output(tmp_path, where, problem):
    target = str(tmp_path / where) if where else str(tmp_path)
    code, stdout, stderr = cli("report", "tests/measured/tiny/tiny-finetune.yaml", "-o", target)
    assert code == 1 and stdout == ""
    assert stderr.splitlines()[0] == f"E901 -o: cannot write the report to '{target}': {problem.format(tmp=tmp_path)}"
    assert "Traceback" not in stderr


def test_bad_input_is_reported_as_for_estimate(tmp_path):
    out = tmp_path / "r.html"
    code, _, stderr = cli("report", "tests/measured/tiny/tiny-finetune.yaml", "--gpu", "h100-8gb", "-o", str(out))
    assert code == 2 and "E503 --gpu: unknown GPU 'h100-8gb'" in stderr
    assert not out.exists()


def test_help_has_examples(capsys):
    code, stdout, _ = cli("report", "--help")
    assert code == 0
    assert "memspec report specs/experiments/llava-1.5-7b-finetune.yaml --gpu h100-80gb -o report.html" in stdout
    assert "-o FILE, --output FILE" in stdout and "--format {text,json}" in stdout


def test_templates_ship_in_the_package():
    """The templates are package data of `compiler` (the wheel ships the package folder) and
    load through the package, so no path of a checkout is needed."""
    folder = resources.files("compiler") / "templates"
    assert (folder / "report.html.j2").is_file() and (folder / "report.css").is_file()
    page = html(api.estimate("tests/measured/tiny/tiny-finetune.yaml"))
    css = (folder / "report.css").read_text(encoding="utf-8")
    assert css.strip().splitlines()[0] in page  # inlined, not linked


def test_gpu_capacity_is_the_catalog_figure(tmp_path):
    gpus, _ = gpu_catalog()
    out = tmp_path / "r.html"
    assert cli("report", "tests/measured/tiny/tiny-finetune.yaml", "--gpu", "rtx4090-24gb", "-o", str(out))[0] == 0
    shown = keyed_values(Page(out.read_text()), estimate_json(["tests/measured/tiny/tiny-finetune.yaml", "--gpu", "rtx4090-24gb"]))
    assert shown["gpu.memory"][0][0] == gpus["rtx4090-24gb"].memory == 24_564 * MIB
