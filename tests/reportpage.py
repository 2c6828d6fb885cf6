"""Reading a `memspec report` page back (html.parser), for the report's tests: the page as
written and the DOM headless Chromium dumps after rendering it are read the same way."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import TYPE_CHECKING

from compiler.cli import main

if TYPE_CHECKING:
    import numpy

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict
    parent: "Element | None" = field(default=None, repr=False)
    parts: list = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join("".join(self.parts).split())

    @property
    def classes(self) -> set:
        return set((self.attrs.get("class") or "").split())


class Page(HTMLParser):
    """Every element of the page in document order (`elements`), with its text (its
    descendants' included)."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        el = Element(tag, dict(attrs), self._open[-1] if self._open else None)
        self.elements.append(el)
        if tag not in VOID:
            self._open.append(el)

    def handle_startendtag(self, tag, attrs):
        self.elements.append(Element(tag, dict(attrs), self._open[-1] if self._open else None))

    def handle_endtag(self, tag):
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i].tag == tag:
                del self._open[i:]
                return

    def handle_data(self, data):
        for el in self._open:
            el.parts.append(data)

    def find(self, tag: str | None = None, cls: str | None = None, **attrs) -> list[Element]:
        out = []
        for el in self.elements:
            if tag and el.tag != tag:
                continue
            if cls and cls not in el.classes:
                continue
            if any(el.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            out.append(el)
        return out

    def inside(self, ancestor: Element, tag: str) -> list[Element]:
        """The `tag` elements below `ancestor`, in document order."""
        out = []
        for el in self.elements:
            if el.tag != tag:
                continue
            p = el.parent
            while p is not None and p is not ancestor:
                p = p.parent
            if p is ancestor:
                out.append(el)
        return out

    def one(self, tag: str | None = None, cls: str | None = None, **attrs) -> Element:
        found = self.find(tag, cls, **attrs)
        assert len(found) == 1, f"{len(found)} elements <{tag} class={cls} {attrs}>"
        return found[0]


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def estimate_json(args: list[str]) -> dict:
    code, out, err = cli("estimate", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def table_json(args: list[str]) -> list[dict]:
    code, out, err = cli("table", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def exact_bytes(text: str) -> int:
    """'34,508,908,544 B' -> 34508908544 (the page's exact figures)."""
    m = re.fullmatch(r"(-?[0-9,]+) B", text)
    assert m, f"not an exact byte figure: {text!r}"
    return int(m.group(1).replace(",", ""))


def lookup(data, key: str):
    for part in key.split("."):
        data = data[part]
    return data


def keyed_values(page: Page, data: dict) -> dict[str, list]:
    """Every `data-key` figure of the page next to the JSON's value at that path:
    key -> [(shown, expected), ...]."""
    out: dict[str, list] = {}
    for el in page.elements:
        key = el.attrs.get("data-key")
        if key is None:
            continue
        expected = lookup(data, key)
        if isinstance(expected, bool):
            shown = {"true": True, "false": False}[el.attrs["data-value"]]
        elif isinstance(expected, int):
            # a figure shown in GiB carries its exact bytes in data-bytes (and its title)
            shown = int(el.attrs["data-bytes"]) if "data-bytes" in el.attrs else exact_bytes(el.text)
        else:
            shown = el.text
        out.setdefault(key, []).append((shown, expected))
    return out


def required_keys(data: dict) -> set[str]:
    """The figures the page must show for this estimate."""
    keys = {
        "experiment",
        "model",
        "file",
        "peak.allocated",
        "peak.reserved",
        "peak.device",
        "seed_sum",
        "peak.allocated_first_step",
        "peak.first_step.phase",
        "peak.first_step.layer",
        "peak.steady_state.allocated",
        "peak.steady_state.phase",
        "peak.steady_state.layer",
    }
    for module, cats in data["peak"]["steady_state"]["breakdown"].items():
        keys |= {f"peak.steady_state.breakdown.{module}.{c}" for c in cats}
    if data["gpu"] is not None:
        keys |= {"gpu.key", "gpu.memory", "gpu.fits", "gpu.headroom", "gpu.margin.bytes"}
    return keys


def layer_rows(page: Page) -> list[dict]:
    """The layer table's cells (text), one dict per `data-row`, in order."""
    rows: list[dict] = []
    for el in page.elements:
        if el.tag == "tr" and "data-row" in el.attrs:
            assert int(el.attrs["data-row"]) == len(rows)
            rows.append({})
        elif el.tag == "td" and "data-col" in el.attrs:
            rows[-1][el.attrs["data-col"]] = el.text
    return rows


def typed_cell(text: str, like):
    """A layer-table cell as the JSON types it, `like` being the JSON's value."""
    if text == "-":
        return None
    if text in ("yes", "no"):
        return text == "yes"
    if isinstance(like, int) and not isinstance(like, bool):
        return int(text.replace(",", ""))
    return text


def png_rgb(path) -> numpy.ndarray:
    """The pixels of an 8-bit RGB or RGBA PNG (what Chromium's --screenshot writes) as a
    (height, width, 3) uint8 array. No imaging library: the scanline filters of the PNG
    specification (section 9) undone row by row."""
    import struct
    import zlib

    import numpy as np

    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat = 8, []
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    out = np.empty((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.int64)
    for r in range(height):
        kind = raw[r * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, r * (stride + 1) + 1).astype(np.int64)
        if kind == 0:
            cur = line
        elif kind == 1:  # Sub: the byte bpp to the left
            cur = np.cumsum(line.reshape(width, bpp), axis=0).reshape(-1) % 256
        elif kind == 2:  # Up: the byte above
            cur = (line + prev) % 256
        else:  # Average (3) and Paeth (4) depend on the byte just reconstructed: one at a time
            x, up, row = line.tolist(), prev.tolist(), [0] * stride
            for i in range(stride):
                a = row[i - bpp] if i >= bpp else 0
                b = up[i]
                if kind == 3:
                    row[i] = (x[i] + (a + b) // 2) & 255
                    continue
                c = up[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (x[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.array(row, dtype=np.int64)
        out[r] = cur
        prev = cur
    return out.reshape(height, width, bpp)[:, :, :3]


def count_colour(pixels, hex_colour: str) -> int:
    """How many pixels are exactly `#rrggbb`."""
    import numpy as np

    rgb = [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]
    return int(np.all(pixels == np.array(rgb, dtype=np.uint8), axis=-1).sum())
