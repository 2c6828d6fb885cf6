"""Estimating imports neither torch nor transformers (and starts fast because of it)."""

import subprocess
import sys

CODE = """
import sys
from compiler.cli import main
rc = main(["estimate", "specs/experiments/llava-1.5-7b-finetune.yaml", "--format", "json"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "transformers", "peft", "numpy"})
sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
sys.exit(rc)
"""


def test_estimate_path_imports_no_torch():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "HEAVY=\n" in out.stderr


def test_package_import_is_light():
    out = subprocess.run(
        [sys.executable, "-c", "import compiler, sys; print(sorted(m for m in sys.modules if m.startswith(('torch', 'jinja2', 'jsonschema'))))"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


def test_report_path_imports_no_torch(tmp_path):
    code = CODE.replace(
        '["estimate", "specs/experiments/llava-1.5-7b-finetune.yaml", "--format", "json"]',
        f'["report", "specs/experiments/llava-1.5-7b-finetune.yaml", "-o", {str(tmp_path / "r.html")!r}]',
    )
    assert '"report"' in code
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "HEAVY=\n" in out.stderr
