"""`memspec measure` runs under a fixed string hash: a console run without PYTHONHASHSEED runs
itself again with compiler.cli.MEASURE_HASH_SEED (transformers' Gemma 3 makes its rotary tables
in the order of a set of strings, which follows the seed); a seed the environment sets is kept,
and a caller's own main(argv) runs as it is."""

import os
import sys

import pytest

from compiler import cli


class _Execed(Exception):
    pass


@pytest.fixture
def execs(monkeypatch):
    calls = []

    def execve(path, args, env):
        calls.append((path, args, env))
        raise _Execed

    monkeypatch.setattr(os, "execve", execve)
    return calls


@pytest.mark.skipif(os.name != "posix", reason="os.execve runs the command again on POSIX only")
def test_a_console_measure_runs_again_under_the_fixed_seed(execs, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.setattr(sys, "argv", ["/opt/venv/bin/memspec", "measure", "exp.yaml", "-o", "r.json"])
    with pytest.raises(_Execed):
        cli.main()
    ((path, args, env),) = execs
    assert (path, args) == (sys.executable, [sys.executable, "/opt/venv/bin/memspec", "measure", "exp.yaml", "-o", "r.json"])
    assert env["PYTHONHASHSEED"] == cli.MEASURE_HASH_SEED == "0"
    assert {k: v for k, v in env.items() if k != "PYTHONHASHSEED"} == dict(os.environ)


@pytest.mark.skipif(os.name != "posix", reason="os.execve runs the command again on POSIX only")
def test_python_dash_m_runs_the_same_module_again(execs, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.setattr(sys, "argv", ["/src/compiler/measure/__main__.py", "exp.yaml"])
    with pytest.raises(_Execed):
        cli.measure_hash_seed(["exp.yaml"], "compiler.measure")
    assert execs[0][1] == [sys.executable, "-m", "compiler.measure", "exp.yaml"]


def test_a_seed_the_environment_sets_is_kept_and_a_callers_argv_runs_here(execs, monkeypatch, tmp_path, capsys):
    missing = str(tmp_path / "missing.yaml")
    monkeypatch.setenv("PYTHONHASHSEED", "7")
    monkeypatch.setattr(sys, "argv", ["memspec", "measure", missing])
    assert cli.main() == 1  # the command itself ran: the experiment file is missing
    monkeypatch.delenv("PYTHONHASHSEED")
    assert cli.main(["measure", missing]) == 1
    assert execs == []
    assert "missing.yaml" in capsys.readouterr().err
