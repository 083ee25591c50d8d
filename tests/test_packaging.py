"""environment.yml mirrors pyproject.toml: same packages, same pins (conda is not available to test it)."""
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!;\[ ]", req, maxsplit=1)[0].strip().lower()


def _spec(req: str) -> str:
    return req.split(";")[0].replace(" ", "").lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [r for r in project["dependencies"] + extras["workflow"] + extras["test"] if _name(r) != "minite-core"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_reqs = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = {_name(r): _spec(r) for r in pip_reqs if not r.startswith("-e")}
    assert "-e ." in pip_reqs
    for req in wanted:
        name = _name(req)
        if name == "torch":  # pyproject keeps a range (the H200 image has 2.11); environment.yml pins the CPU wheel
            assert listed["torch"] == "torch==2.13.0"
            continue
        assert listed.get(name) == _spec(req), f"environment.yml: {name} should be {_spec(req)!r}, is {listed.get(name)!r}"
    assert set(listed) == {_name(r) for r in wanted}, "environment.yml lists packages pyproject.toml does not"


def test_readme_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in readme and "<!-- main-command -->" in readme
    assert "test-command" in ci  # .ci/run extracts and runs the README's test command
    assert "torch==2.13.0" in readme  # pinned: an unpinned torch pulls a multi-GB CUDA build
