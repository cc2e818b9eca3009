"""Set-up files agree: environment.yml and pyproject.toml list the same packages; README's test
command is what .ci/run calls."""

import pathlib
import re
import tomllib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch", "cuda-nvvm": "nvidia-nvvm", "cuda-nvrtc": "nvidia-cuda-nvrtc"}  # conda-forge -> PyPI


def _norm(spec: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    name = m.group(1).lower().replace("_", "-")
    return CONDA_NAMES.get(name, name), m.group(2).replace(" ", "")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        pip_specs += extra
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_specs = [d for d in env["dependencies"] if isinstance(d, str) and not d.startswith(("python", "pip"))]
    assert dict(map(_norm, conda_specs)) == dict(map(_norm, pip_specs))


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.split("#")[0].strip()]
    assert len(commands) == 2, commands
    main_cmd, test_cmd = commands
    assert "main" in main_cmd and "test" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci
