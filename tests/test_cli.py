"""The course's one command line: ``python -m ddlcourse <command>`` reaches every tool, and nothing else does."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from ddlcourse.__main__ import COMMANDS, GROUPS, main, usage

ROOT = Path(__file__).resolve().parent.parent
# The programs a launcher or a tool starts by module name: not commands of the course.
PROGRAMS = {"ddlcourse/__main__.py": "the command line itself",
            "ddlcourse/cluster/engine.py": "the engines' program (MPICluster starts it)",
            "ddlcourse/cluster/watchdog.py": "the watchdog of a cluster (MPICluster starts it)",
            "ddlcourse/cluster/forkserver.py": "the fork server (run as a script by its own start)",
            "ddlcourse/elastic.py": "the training script torchrun restarts in notebook 25",
            "ddlcourse/exercises/simranks.py": "a simulated rank of a check's rehearsal (the rehearsal starts it)"}


def test_help_lists_every_command_once():
    grouped = [n for _, names in GROUPS for n in names]
    assert sorted(grouped) == sorted(COMMANDS) and len(set(grouped)) == len(grouped)
    text = usage()
    assert all(f"  {n} " in text for n in COMMANDS)


def test_no_module_is_a_command_line_of_its_own():
    """``python -m ddlcourse.checks`` and ``python -m ddlcourse check`` were two commands: every tool is reached
    through ``python -m ddlcourse`` only."""
    own = []
    for f in sorted((ROOT / "ddlcourse").rglob("*.py")):
        rel = str(f.relative_to(ROOT))
        for node in ast.parse(f.read_text()).body:
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                    and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"')):
                if rel not in PROGRAMS:
                    own.append(rel)
    assert not own, f"modules with a command line of their own (make it a command of ddlcourse/__main__.py): {own}"


def test_every_command_has_its_own_help(capsys):
    for name in COMMANDS:
        try:
            code = main([name, "--help"])
        except SystemExit as e:             # argparse's --help
            code = e.code
        assert code == 0, name
        out = capsys.readouterr().out
        assert out.startswith("usage: python -m ddlcourse"), (name, out[:200])


def test_an_unknown_command_lists_the_commands(capsys):
    assert main(["nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown command 'nope'" in err and "check-exercise" in err and "bench-ddp" in err


def test_the_command_line_runs_as_a_module():
    p = subprocess.run([sys.executable, "-m", "ddlcourse", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "bench-simp" in p.stdout and "srun-mpi" in p.stdout, p.stderr


def test_show_prints_the_real_source_between_two_lines(capsys):
    import ddlcourse
    from ddlcourse.parallel import data_parallel as dp
    body = ddlcourse.show(dp.wrap, 'if backend == "ddp"', "return ddp, optimizer")
    out = capsys.readouterr().out
    assert out.startswith("# ddlcourse/parallel/data_parallel.py, lines ") and body in out
    assert body.splitlines()[0] == 'if backend == "ddp":' and body.splitlines()[-1].strip() == "return ddp, optimizer"
    with pytest.raises(ValueError, match="contains 'no such line'"):
        ddlcourse.show(dp.wrap, "no such line")
