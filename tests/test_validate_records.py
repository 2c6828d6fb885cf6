"""`memspec validate` on records written by hand, as docs/validate-against-your-measurements.md
shows them: the keys validate reads (schemas/record.schema.json) are enough, and one of them
wrong is refused with its file, line and key before anything is estimated."""

import json

from compiler.cli import main

# the guide's record, with the figures a run would write
GUIDE_RECORD = {
    "schema": "memspec/measured/v1",
    "name": "qwen2.5-0.5b-b4-s1024-h100",
    "source": "gpu",
    "experiment": {"model": "specs/qwen2/qwen2.5-0.5b.yaml", "micro_batch": 4, "seq_len": 1024, "gradient_checkpointing": ["language"], "gpu": "h100-80gb"},
    "allocated": 9_000_000_000,
    "allocated_first_step": 8_000_000_000,
    "reserved": 10_000_000_000,
    "device": None,
}


def test_a_record_written_as_the_guide_shows_is_estimated(tmp_path, capsys):
    (tmp_path / "rec.json").write_text(json.dumps(GUIDE_RECORD))
    assert main(["validate", str(tmp_path / "rec.json"), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["records"]
    assert row["name"] == "qwen2.5-0.5b-b4-s1024-h100" and row["reason"] is None
    assert row["estimated"]["allocated"] > 0 and row["measured"]["device"] is None


def test_a_key_validate_reads_of_the_wrong_type_is_refused_with_its_line(tmp_path, capsys):
    for key, value, message in (
        ("experiment", "qwen", "$.experiment: expected mapping, got string 'qwen'"),
        ("name", ["a"], "$.name: expected string, got a list"),
        ("reserved", "10 GB", "$.reserved: expected integer or null, got string '10 GB'"),
    ):
        (tmp_path / "rec.json").write_text(json.dumps({**GUIDE_RECORD, key: value}, indent=2))
        assert main(["validate", str(tmp_path / "rec.json")]) == 1
        out, err = capsys.readouterr()
        line = 1 + next(i for i, text in enumerate((tmp_path / "rec.json").read_text().splitlines()) if text.strip().startswith(f'"{key}"'))
        assert out == "" and f"rec.json:{line}:3: E20" in err and message in err, err
    # in a folder of records, the one that breaks the schema is named the same way
    (tmp_path / "good.json").write_text(json.dumps({**GUIDE_RECORD, "name": "good"}))
    assert main(["validate", str(tmp_path)]) == 1
    assert "rec.json:" in capsys.readouterr().err
