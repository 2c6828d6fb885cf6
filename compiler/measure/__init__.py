"""The measuring side: ground-truth peak memory of real training steps.

`memspec measure` builds the Hugging Face model from its config (random weights, nothing
downloaded), runs real training steps on fake tensors under a CUDA emulation, and counts
the bytes alive after every op (`tracer`, `emulation`, `harness`); `record` writes the
results as `memspec/measured/v1` JSON, `cli` is the command line. See docs/measuring.md.

Importing this package imports nothing heavy: torch, transformers and peft are imported
only by `tracer`, `emulation` and `harness`, and only when a measurement runs.
"""
