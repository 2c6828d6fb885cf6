"""commands/processes.py: pieces handed to forked processes come back in their order and
the same as made in one process; `memspec validate` compares the same either way."""

from pathlib import Path

from compiler.commands import processes

ROOT = Path(__file__).resolve().parent.parent


def _square(n: int) -> int:
    return n * n


def test_ordered_keeps_the_order_in_processes_and_here(monkeypatch):
    items = list(range(3 * processes.PER_PROCESS))
    for cpus in (1, 2, 3):
        monkeypatch.setattr(processes, "cpus", lambda cpus=cpus: cpus)
        assert list(processes.ordered(_square, items)) == [n * n for n in items]


def test_validate_compares_the_same_in_processes(monkeypatch):
    from compiler.commands.validation import record_files, validate_records

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("MEMSPEC_NO_CACHE", "1")
    files = record_files([ROOT / "tests" / "measured" / "gpu"])[: 2 * processes.PER_PROCESS]
    answers = []
    for cpus in (1, 2):
        monkeypatch.setattr(processes, "cpus", lambda cpus=cpus: cpus)
        answers.append(validate_records(files))
    assert answers[0] == answers[1] and len(answers[0]) == 2 * processes.PER_PROCESS
