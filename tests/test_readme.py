"""The README's first lines give the two commands, and CI runs the test one."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    lines = REPO.joinpath("README.md").read_text().splitlines()
    start = lines.index("```bash") + 1
    cmds = []
    for line in lines[start:]:
        if line.startswith("```"):
            break
        cmds.append(line.split("  #")[0].strip())
    return cmds


def test_two_commands_first():
    cmds = _readme_commands()
    assert len(cmds) == 2
    assert "vllm-edge run" in cmds[0] and "pytest" in cmds[1]
    assert REPO.joinpath("README.md").read_text().index("```bash") < 40


def test_ci_runs_the_readme_test_command():
    ci = REPO.joinpath(".ci", "run").read_text()
    assert _readme_commands()[1] in ci
