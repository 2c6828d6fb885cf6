"""What `api.run` leaves behind: the garbage collector as it found it, and layer trees that
reference counting frees (no cycles for the collector to find)."""

import gc
import weakref

import pytest

from compiler.api import layers, load_inputs, run

EXPERIMENT = "specs/experiments/llava-1.5-7b-finetune.yaml"


@pytest.fixture(scope="module")
def inputs():
    return load_inputs(EXPERIMENT)


@pytest.mark.parametrize("enabled", [True, False])
def test_an_estimate_leaves_the_garbage_collector_as_it_found_it(inputs, enabled):
    spec, setup = inputs
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        report = run(spec, setup, table=False)
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
    assert report.device > report.reserved >= report.allocated > 0


def test_a_layer_tree_is_freed_without_the_garbage_collector(inputs):
    spec, setup = inputs
    nodes = layers(spec, setup)
    root = nodes[-1]
    flat = root.walk()
    # walk: the node, then its descendants depth first in forward order
    assert flat[0] is root and flat[1] is root.children[0] and len(flat) == 1 + sum(len(c.walk()) for c in root.children)
    assert root.walk() == flat
    leaf = weakref.ref(flat[-1])
    top = weakref.ref(root)
    was = gc.isenabled()
    gc.disable()
    try:
        del nodes, root, flat
        assert top() is None and leaf() is None  # freed by reference counting alone
    finally:
        if was:
            gc.enable()
