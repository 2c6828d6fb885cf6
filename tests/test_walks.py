"""The parallelism strategies of the simulated step (compiler/pipeline/walks/): the folder is
the registry, one placing walk per setup, and imports go down the pipeline."""

import ast
from pathlib import Path

from test_zero3 import ZERO3  # noqa: E402  (tests/ is on sys.path under pytest's rootdir conftest)

from compiler.api import load_inputs
from compiler.pipeline.walks import _registry, strategies

ROOT = Path(__file__).resolve().parent.parent
WALKS = ROOT / "compiler" / "pipeline" / "walks"
FINETUNE = "specs/experiments/llava-1.5-7b-finetune.yaml"  # ZeRO-3, dp 8
FSDP = "specs/experiments/llava-1.5-7b-finetune-fsdp2.yaml"


def _names(path, overrides=None):
    _, setup = load_inputs(path, overrides)
    return [cls.__name__ for cls in strategies(setup, 1)]


def test_every_strategy_module_is_found():
    defined = {p.stem for p in WALKS.glob("*.py") if "\nWALKS = " in p.read_text()}
    found = {cls.__module__.rsplit(".", 1)[1] for cls in _registry()}
    assert found == defined == {"data_parallel", "deepspeed", "zero12", "zero3", "fsdp", "offload", "pipeline", "device_map"}


def test_one_placing_walk_then_the_others():
    assert _names(FINETUNE) == ["Zero3Walk"]
    assert _names(FINETUNE, {"deepspeed": {**ZERO3, "offload_optimizer": "cpu"}}) == ["Zero3Walk", "OptimizerOffloadWalk"]
    assert _names(FINETUNE, {"deepspeed": {"zero": 2, "contiguous_gradients": True}}) == ["Zero12Walk"]
    assert _names(FINETUNE, {"deepspeed": {"zero": 2, "offload_optimizer": "cpu"}}) == ["DeepSpeedWalk", "OptimizerOffloadWalk"]
    assert _names(FSDP) == ["FsdpWalk"]
    assert _names(FINETUNE, {"deepspeed": {"zero": 0}, "dp": 1}) == ["DataParallelWalk"]


def _imports(path: Path) -> set[str]:
    """The modules `path` imports, relative ones resolved against its package."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            out.add(".".join(base + tuple((node.module or "").split("."))).rstrip("."))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_imports_go_down():
    # the walks are part of simulate: they never import it, nor anything after it
    for path in WALKS.glob("*.py"):
        assert not {m for m in _imports(path) if m.startswith(("compiler.pipeline.simulate", "compiler.pipeline.render", "compiler.api"))}, path
    # the memory models import no pipeline stage
    for path in (ROOT / "compiler" / "memory").glob("*.py"):
        assert not {m for m in _imports(path) if m.startswith(("compiler.pipeline", "compiler.api"))}, path
