"""Formula expressions as plain Python: a checked expression (the grammar grammar.py's
`_check_node` allows) written as Python source over its scope and compiled once per text.
`FUNCTIONS` are the functions expressions may call, the same in Jinja2's sandbox and here;
`MAX_POWER_BITS` bounds a power in both."""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    """The smallest power of two >= n (triton.next_power_of_2; 1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _floordiv_sqrt(a: int, n: int, d: int) -> int:
    """int(a // math.sqrt(n / d)), in double precision as Python computes it: LLaVA-OneVision's
    anyres_max downscale (pack_image_features, _get_unpadded_features) divides a feature side
    by that ratio, and where a / sqrt(n / d) is a whole number the float result is that
    number or one less, which no integer expression reproduces."""
    return int(a // math.sqrt(n / d))


# A tile search over more grids than this is refused: processors allow 12 (InternVL, Aya
# Vision's max_patches) and the search is quadratic in it.
MAX_PATCHES = 64


def _crop_to_patches(height: int, width: int, tile: int, min_patches: int, max_patches: int) -> int:
    """How many images GotOcr2ImageProcessor.crop_image_to_patches makes of one height x width
    image (InternVL's dynamic_preprocess, Aya Vision): the grid of min_patches to max_patches
    tiles whose columns / rows is closest to width / height, found as
    get_optimal_tiled_canvas finds it, in its float arithmetic and its order (grids by tile
    count, then by columns; on a tie the later grid wins while the image's area is over half
    the grid's), plus the thumbnail a grid of more than one tile gets (use_thumbnail)."""
    if not 1 <= min_patches <= max_patches <= MAX_PATCHES or height < 1 or width < 1 or tile < 1:
        raise ValueError(
            f"crop_to_patches({height}, {width}, {tile}, {min_patches}, {max_patches}): sizes >= 1 and 1 <= min_patches <= max_patches <= {MAX_PATCHES}"
        )
    grids = sorted(
        ((c, r) for c in range(1, max_patches + 1) for r in range(1, max_patches + 1) if min_patches <= c * r <= max_patches), key=lambda g: g[0] * g[1]
    )
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for columns, rows in grids:
        diff = abs(aspect - columns / rows)
        if diff < best_diff:
            best_diff, best = diff, (columns, rows)
        elif diff == best_diff and area > 0.5 * tile * tile * columns * rows:
            best = (columns, rows)
    blocks = best[0] * best[1]
    return blocks + 1 if blocks > 1 else blocks


def _canvas_tiles(height: int, width: int, tile: int, max_patches: int) -> int:
    """How many images Cohere2VisionImageProcessor.crop_image_to_patches makes of one height x
    width image (Command A Vision): its get_optimal_tiled_canvas over the grids of at most
    max_patches tiles (columns-major, then stably by tile count) takes the scale each grid needs,
    min(columns * tile / width, rows * tile / height) in double precision; the first grid with the
    smallest scale >= 1 wins, or, when every grid would shrink the image, the first with the
    largest; min_patches plays no part. Plus the thumbnail a grid of more than one tile gets."""
    if not 1 <= max_patches <= MAX_PATCHES or height < 1 or width < 1 or tile < 1:
        raise ValueError(f"canvas_tiles({height}, {width}, {tile}, {max_patches}): sizes >= 1 and 1 <= max_patches <= {MAX_PATCHES}")
    grids = sorted(((c, r) for c in range(1, max_patches + 1) for r in range(1, max_patches + 1) if c * r <= max_patches), key=lambda g: g[0] * g[1])
    scales = [min(c * tile / width, r * tile / height) for c, r in grids]
    if all(s < 1 for s in scales):
        best = grids[scales.index(max(scales))]
    else:
        upscales = [s if s >= 1 else 10e9 for s in scales]
        best = grids[upscales.index(min(upscales))]
    blocks = best[0] * best[1]
    return blocks + 1 if blocks > 1 else blocks


# Ovis2ImageProcessor's covering threshold (get_min_tile_covering_grid's covering_threshold,
# which crop_image_to_patches leaves at its default)
COVERING_THRESHOLD = 0.9


def _covering_tiles(height: int, width: int, tile: int, max_patches: int) -> int:
    """How many images Ovis2ImageProcessor.crop_image_to_patches makes of one height x width
    image with use_covering_area_grid (Ovis2): get_min_tile_covering_grid over the grids of 1 to
    max_patches tiles (columns-major, then stably by tile count) splits the image into each grid
    (the grid's first number as rows there, split_image_into_grid), takes the area each part
    covers once scaled to fit a tile (compute_patch_covering_area) over the image's area, in
    double precision, and picks the grid of fewest tiles (then the better covering) among those
    covering more than 0.9, or the best covering (then the fewest tiles) when none does; plus the
    thumbnail a grid of more than one tile gets."""
    if not 1 <= max_patches <= MAX_PATCHES or height < 1 or width < 1 or tile < 1:
        raise ValueError(f"covering_tiles({height}, {width}, {tile}, {max_patches}): sizes >= 1 and 1 <= max_patches <= {MAX_PATCHES}")
    grids = sorted(((c, r) for c in range(1, max_patches + 1) for r in range(1, max_patches + 1) if c * r <= max_patches), key=lambda g: g[0] * g[1])

    def covered(left: int, upper: int, right: int, lower: int) -> float:
        long, short = max(right - left, lower - upper), min(right - left, lower - upper)
        if long > tile:
            short, long = short / long * tile, tile
        return long * short

    def ratio(grid: tuple[int, int]) -> float:
        rows, cols = grid
        row_h, col_w = height // rows, width // cols
        parts = [
            covered(col * col_w, row * row_h, width if col == cols - 1 else (col + 1) * col_w, height if row == rows - 1 else (row + 1) * row_h)
            for row in range(rows)
            for col in range(cols)
        ]
        return sum(parts) / (width * height)

    scored = [(grid, ratio(grid)) for grid in grids]
    enough = [(grid, r) for grid, r in scored if r > COVERING_THRESHOLD]
    if enough:
        best = min(enough, key=lambda x: (x[0][0] * x[0][1], -x[1]))[0]
    else:
        best = min(scored, key=lambda x: (-x[1], x[0][0] * x[0][1]))[0]
    blocks = best[0] * best[1]
    return blocks + 1 if blocks > 1 else blocks


# Phi3VImageProcessor's crop budget (num_crops) is at most this: 4 and 16 are released
MAX_HD_CROPS = 64


def _hd_grid(height: int, width: int, tile: int, max_crops: int) -> tuple[int, int]:
    """(rows, columns) of the tile-side crops Phi3VImageProcessor's HD_transform makes of one
    height x width image (Phi-3-vision, Phi-3.5-vision): the long side laid along the width
    (a taller image is transposed first), the largest scale with scale * ceil(scale / ratio) <=
    max_crops (ratio = long side / short side), the image resized to scale tiles along the long
    side and int(scale * tile / ratio) pixels along the short one, which padding_336 pads up to
    whole tiles; in the processor's float arithmetic."""
    if not 1 <= max_crops <= MAX_HD_CROPS or height < 1 or width < 1 or tile < 1:
        raise ValueError(f"hd_rows / hd_cols({height}, {width}, {tile}, {max_crops}): sizes >= 1 and 1 <= max_crops <= {MAX_HD_CROPS}")
    transposed = width < height
    long, short = (height, width) if transposed else (width, height)
    ratio = long / short
    scale = 1
    while scale * math.ceil(scale / ratio) <= max_crops:
        scale += 1
    scale -= 1
    new_short = int(int(scale * tile) / ratio)
    padded = int(math.ceil(new_short / tile))
    return (scale, padded) if transposed else (padded, scale)


def _hd_rows(height: int, width: int, tile: int, max_crops: int) -> int:
    """The rows of Phi3VImageProcessor's HD crops (_hd_grid)."""
    return _hd_grid(height, width, tile, max_crops)[0]


def _hd_cols(height: int, width: int, tile: int, max_crops: int) -> int:
    """The columns of Phi3VImageProcessor's HD crops (_hd_grid)."""
    return _hd_grid(height, width, tile, max_crops)[1]


# MiniCPMVImageProcessor's max_slice_nums is at most this: 9 is released (MiniCPM-V 2.6, 4.6)
MAX_SLICES = 64


def _ensure_divide(length: float, unit: int) -> int:
    """MiniCPM-V's ensure_divide: length rounded (Python's round, half to even) to a multiple of unit, at least unit."""
    return max(round(length / unit) * unit, unit)


def _best_resize(height: float, width: float, scale: int, unit: int) -> tuple[int, int]:
    """MiniCPM-V's find_best_resize where it resizes (always, as the processors call it: an
    unsliced image with allow_upscale, a sliced one has more than scale^2 pixels, a slice with
    allow_upscale): the area brought to about scale^2 at the aspect ratio, height
    int(scale / sqrt(w / h)), width int(height * w / h), each rounded to a multiple of unit."""
    aspect = width / height
    new_h = int(scale / math.sqrt(aspect))
    return _ensure_divide(new_h, unit), _ensure_divide(int(new_h * aspect), unit)


def _slice_grid(height: int, width: int, scale: int, max_slices: int) -> tuple[int, int] | None:
    """(rows, columns) of the slices MiniCPM-V's processor cuts an image into, None for an image it
    does not slice: get_sliced_grid's multiple = min(ceil(w h / scale^2), max_slices), then of the
    grids of multiple - 1, multiple and multiple + 1 slices (not 1, at most max_slices) the one
    whose log(columns / rows) is nearest log(w / h), in float arithmetic. On an exact tie the grid
    of more rows wins: MiniCPMV4_6ImageProcessor's rule, and MiniCPMVImageProcessor's (2.6) within
    one slice count, its grids ordered by columns with the first kept; the two differ only on a
    tie between grids of different slice counts, which needs (c1 c2) / (r1 r2) = (w / h)^2 with
    c1 r1 and c2 r2 one or two apart, whose product is never a square: no such exact tie exists."""
    if height < 1 or width < 1 or scale < 1 or not 1 <= max_slices <= MAX_SLICES:
        raise ValueError(f"slice_count / slice_cells({height}, {width}, {scale}, {max_slices}): sizes >= 1 and 1 <= max <= {MAX_SLICES}")
    log_ratio = math.log(width / height)
    multiple = min(math.ceil(width * height / (scale * scale)), max_slices)
    if multiple <= 1:
        return None
    best, best_error = (1, 1), float("inf")
    for slices in (multiple - 1, multiple, multiple + 1):
        if slices == 1 or slices > max_slices:
            continue
        for rows in range(1, slices + 1):
            if slices % rows:
                continue
            error = abs(log_ratio - math.log(slices // rows / rows))
            if error < best_error or (error == best_error and rows > best[0]):
                best, best_error = (rows, slices // rows), error
    return best


def minicpmv_slicing(height: int, width: int, scale: int, unit: int, max_slices: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int] | None]:
    """What MiniCPM-V's processor makes of one height x width image (MiniCPMVImageProcessor.
    slice_image for 2.6, MiniCPMV4_6ImageProcessor._preprocess for 4.6): the source image's
    resized (height, width), the grid (rows, columns) or None, and one slice's (height, width)
    or None; every side a multiple of unit (the patch, 14, in 2.6; patch x 4, 56, in 4.6). The
    slices: get_refine_size rounds the image to whole grid cells (ensure_divide by the grid),
    resizes one cell (find_best_resize with allow_upscale) and the image to the grid of them."""
    if unit < 1:
        raise ValueError(f"slice_source / slice_cells: unit {unit} must be >= 1")
    grid = _slice_grid(height, width, scale, max_slices)
    source = _best_resize(height, width, scale, unit)
    if grid is None:
        return source, (0, 0), None
    rows, cols = grid
    cell_h, cell_w = _ensure_divide(height, rows) / rows, _ensure_divide(width, cols) / cols
    return source, grid, _best_resize(cell_h, cell_w, scale, unit)


def _slice_count(height: int, width: int, scale: int, max_slices: int) -> int:
    """The slices MiniCPM-V's processor cuts an image into besides its source image (_slice_grid); 0 unsliced."""
    grid = _slice_grid(height, width, scale, max_slices)
    return 0 if grid is None else grid[0] * grid[1]


def _slice_source(height: int, width: int, scale: int, unit: int) -> int:
    """unit x unit cells of MiniCPM-V's resized source image (the thumbnail of a sliced image)."""
    if unit < 1 or height < 1 or width < 1 or scale < 1:
        raise ValueError(f"slice_source({height}, {width}, {scale}, {unit}): sizes >= 1")
    h, w = _best_resize(height, width, scale, unit)
    return (h // unit) * (w // unit)


def _slice_cells(height: int, width: int, scale: int, unit: int, max_slices: int) -> int:
    """unit x unit cells of one of MiniCPM-V's slices (minicpmv_slicing); 0 unsliced."""
    _, _, piece = minicpmv_slicing(height, width, scale, unit, max_slices)
    return 0 if piece is None else (piece[0] // unit) * (piece[1] // unit)


FUNCTIONS: Mapping[str, Callable[..., int]] = {
    "min": min,
    "max": max,
    "ceil_div": _ceil_div,
    "next_pow2": _next_pow2,
    "floordiv_sqrt": _floordiv_sqrt,
    "crop_to_patches": _crop_to_patches,
    "canvas_tiles": _canvas_tiles,
    "covering_tiles": _covering_tiles,
    "hd_rows": _hd_rows,
    "hd_cols": _hd_cols,
    "slice_count": _slice_count,
    "slice_source": _slice_source,
    "slice_cells": _slice_cells,
}

# A power whose result would need more bits than this is refused (E404): 2 ** 4096 is far past
# any byte count, and the bound keeps an expression's evaluation instant.
MAX_POWER_BITS = 4096


# --------------------------------------------------------------------------- plain Python
#
# A checked expression (the grammar `_check_node` allows) is also written as Python source
# over the scope `s` and compiled once per source text: the same operators and functions as
# the sandbox's generated code, some forty times faster a call. Anything that raises there
# (an undefined name, a division by zero, a power past MAX_POWER_BITS) is evaluated again by
# Jinja2, so that errors, and any value Jinja2 would give in their place, stay its own.

_PY_BINOPS = {"Add": "+", "Sub": "-", "Mul": "*", "Div": "/", "FloorDiv": "//", "Mod": "%", "And": "and", "Or": "or"}
_PY_UNOPS = {"Neg": "-", "Pos": "+", "Not": "not "}
_PY_COMPARE = {"eq": "==", "ne": "!=", "gt": ">", "gteq": ">=", "lt": "<", "lteq": "<=", "in": "in", "notin": "not in"}


def _python_of(node) -> str | None:
    """Python source for a checked expression's AST; None for a node outside the grammar."""
    try:
        return _py(node)
    except KeyError:
        return None


def _py(node) -> str:
    kind = type(node).__name__
    if kind == "Const":
        value = node.value
        if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
            raise KeyError(kind)  # NB: no literal for these; Jinja2 keeps them
        return repr(value)
    if kind == "Name":
        if node.name in FUNCTIONS:  # NB: a scope value of that name wins, as in Jinja2's lookup
            return f"(s[{node.name!r}] if {node.name!r} in s else _F[{node.name!r}])"
        return f"s[{node.name!r}]"
    if kind == "Getattr":  # bytes.<dtype>: a dict lookup, as the sandbox's getattr falls back to
        return f"{_py(node.node)}[{node.attr!r}]"
    if kind == "Pow":
        return f"_pow({_py(node.left)}, {_py(node.right)})"
    if kind in _PY_BINOPS:
        return f"({_py(node.left)} {_PY_BINOPS[kind]} {_py(node.right)})"
    if kind in _PY_UNOPS:
        return f"({_PY_UNOPS[kind]}{_py(node.node)})"
    if kind == "Compare":
        return "(" + _py(node.expr) + "".join(f" {_PY_COMPARE[o.op]} {_py(o.expr)}" for o in node.ops) + ")"
    if kind == "CondExpr":
        return f"({_py(node.expr1)} if {_py(node.test)} else {_py(node.expr2)})"
    if kind == "Call":
        return f"{_py(node.node)}(" + ", ".join(_py(a) for a in node.args) + ")"
    raise KeyError(kind)


def _pow(left: Any, right: Any) -> Any:
    if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0 and right * abs(left).bit_length() > MAX_POWER_BITS:
        raise ValueError("power past MAX_POWER_BITS")  # NB: Jinja2's evaluation gives the message
    return left**right


_PY_GLOBALS: dict[str, Any] = {"__builtins__": {}, "_F": FUNCTIONS, "_pow": _pow}
_CALLABLES: dict[str, Callable[[Mapping[str, Any]], Any]] = {}


def _callable(python: str) -> Callable[[Mapping[str, Any]], Any]:
    found = _CALLABLES.get(python)
    if found is None:
        found = _CALLABLES[python] = eval(compile(f"lambda s: {python}", "<formula>", "eval"), _PY_GLOBALS)  # noqa: S307
    return found
