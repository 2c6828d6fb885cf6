"""The HTML report in a real browser: headless Chromium loads the page from a file:// URL,
the figures in the DOM it renders equal `memspec estimate --format json`, and a screenshot is
kept (under the test's tmp_path, copied to test-artifacts/, which git ignores) whose pixels
show the charts painted in their colours.

Needs a Chromium binary (`chromium`; Debian/Ubuntu: apt-get install chromium). Without one
the tests skip, saying so; `.ci/run` installs it and sets MEMSPEC_REQUIRE_CHROMIUM=1, under
which a missing browser fails instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from reportpage import Page, cli, count_colour, estimate_json, keyed_values, layer_rows, png_rgb, required_keys, table_json, typed_cell

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
WINDOW = (1280, 2400)  # the screenshot: headline, bars, timeline and the start of the layer table
CASES = {
    # 33.40 GiB on an 79.65 GiB H100: fits
    "fits": ["specs/experiments/llava-1.5-7b-finetune.yaml", "--gpu", "h100-80gb"],
    # 55.63 GiB on a 22.49 GiB A10G: does not fit, the capacity line runs under the curve's top
    "does-not-fit": ["specs/experiments/llava-1.5-7b-pretrain.yaml", "--gpu", "a10g-24gb"],
}
# compiler/templates/report.css
COLOURS = {
    "parameters": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer_states": "#e15759",
    "activations": "#59a14f",
    "transient": "#b07aa1",
    "capacity": "#b42318",
    "fits": "#e7f5ea",
    "does-not-fit": "#fdecea",
}


def chromium_binary() -> str | None:
    for name in (os.environ.get("MEMSPEC_CHROMIUM"), "chromium", "chromium-browser"):
        found = shutil.which(name) if name else None
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = chromium_binary()
    if binary is None:
        reason = (
            "no Chromium binary on PATH (chromium, chromium-browser, or $MEMSPEC_CHROMIUM): the browser test of "
            "the HTML report needs one; install it with `apt-get install chromium` (.ci/run does)"
        )
        if os.environ.get("MEMSPEC_REQUIRE_CHROMIUM"):
            pytest.fail(reason)
        pytest.skip(reason)
    return binary


def _browse(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    # NB: --no-sandbox because CI runs as root; its own profile folder keeps runs apart.
    command = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def page(request, tmp_path_factory, chromium):
    folder = tmp_path_factory.mktemp(f"browser-{request.param}")
    html = folder / "report.html"
    code, _, stderr = cli("report", *CASES[request.param], "-o", str(html))
    assert code == 0, stderr
    return {"name": request.param, "args": CASES[request.param], "html": html, "folder": folder, "chromium": chromium}


def test_rendered_figures_equal_the_estimate_json(page):
    dom = _browse(page["chromium"], page["folder"] / "profile", "--dump-dom", page["html"].as_uri()).stdout
    rendered = Page(dom)
    data = estimate_json(page["args"])
    shown = keyed_values(rendered, data)
    assert not required_keys(data) - set(shown)
    for key, pairs in shown.items():
        for got, expected in pairs:
            assert got == expected, key
    table = table_json(page["args"])
    rows = layer_rows(rendered)
    assert len(rows) == len(table)
    for row, expected in zip(rows, table):
        for column, text in row.items():
            assert typed_cell(text, expected[column]) == expected[column], (expected["path"], column)
    assert [s.attrs["id"] for s in rendered.find("section")] == ["headline", "breakdown", "timeline", "layers", "assumptions"]
    assert len(rendered.find("svg")) == 2


def test_screenshot_shows_the_charts(page, record_property):
    shot = page["folder"] / f"report-{page['name']}.png"
    _browse(page["chromium"], page["folder"] / "profile", f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", page["html"].as_uri())
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / shot.name
    shutil.copyfile(shot, kept)
    record_property("screenshot", str(kept))
    print(f"screenshot: {shot} (kept as {kept})")

    # NB: numpy comes with the [measure] extra (transformers needs it), which the README's test command installs
    pytest.importorskip("numpy", reason="reading the screenshot's pixels needs numpy (pip install '.[test,measure]')")
    pixels = png_rgb(shot)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    data = estimate_json(page["args"])
    cats = {
        c: sum(m[c] for m in data["peak"]["steady_state"]["breakdown"].values())
        for c in COLOURS
        if c in ("parameters", "gradients", "optimizer_states", "activations", "transient")
    }
    # every factor above 1 GiB at the peak is a bar segment far larger than its 11 x 11 legend
    # swatch: at least five swatches' worth (ZeRO-3's 1.6 GiB gradient partition on an 80 GiB
    # scale draws about 840 px besides its swatch)
    for category, total in cats.items():
        if total >= 1 << 30:
            assert count_colour(pixels, COLOURS[category]) > 5 * 11 * 11, category
    # the verdict banner in its colour, and the capacity line (dashed, in the verdict's red, with the peak marker)
    assert count_colour(pixels, COLOURS[page["name"]]) > 20_000
    assert count_colour(pixels, COLOURS["capacity"]) > 500
