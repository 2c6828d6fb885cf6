"""GotOcr2ImageProcessor's tile search restated from its source, kept as the reference
tests/test_internvl.py and tests/test_aya_vision.py compare the expression function
`crop_to_patches` (compiler/library/expr_python.py) with. Not used by memspec."""

from __future__ import annotations


def optimal_grid(height: int, width: int, tile: int, min_tiles: int, max_tiles: int) -> tuple[int, int]:
    """(columns, rows): transformers/models/got_ocr2/image_processing_got_ocr2.py
    `get_optimal_tiled_canvas` (InternVL's `find_closest_aspect_ratio`), restated because that
    module needs torchvision."""
    grids = sorted(((w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if min_tiles <= w * h <= max_tiles), key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best_diff, best = float("inf"), (1, 1)
    for grid in grids:
        diff = abs(aspect - grid[0] / grid[1])
        if diff < best_diff:
            best_diff, best = diff, grid
        elif diff == best_diff and area > 0.5 * tile * tile * grid[0] * grid[1]:
            best = grid
    return best
