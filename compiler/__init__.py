"""memspec: predict the peak GPU memory of a training step from declarative specs.

    from compiler import estimate
    report = estimate("specs/experiments/llava-1.5-7b-finetune.yaml", micro_batch=8)
    report.allocated, report.reserved, report.device     # bytes, per GPU
    report.estimate.peak.phase, report.estimate.peak.path

The stages live in `compiler/pipeline/` (see compiler/README.md); this package imports them lazily so
that `import compiler` stays cheap.
"""

__all__ = ["estimate", "load_spec", "load_inputs", "run", "Report"]


def __getattr__(name):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")
