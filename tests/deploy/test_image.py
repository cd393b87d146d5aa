"""deploy/Dockerfile is built from the Makefile targets CI runs, and fits the chart.

test_image_build.py builds and runs the image where a container engine can
run; these checks hold everywhere: the Dockerfile's steps are the ones CI
exercises, and its contract with the chart.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "deploy" / "Dockerfile").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()


def instructions(name: str) -> list[str]:
    return re.findall(rf"^{name} (.+)$", DOCKERFILE, re.MULTILINE)


def test_the_build_runs_the_makefile_targets_ci_runs_without_dev_tools() -> None:
    (run,) = [r for r in instructions("RUN") if "make " in r]
    assert "make venv jars bytecode UV_SYNC_FLAGS=--no-dev" in run
    setup = re.search(r"^setup: (.+)$", MAKEFILE, re.MULTILINE)
    assert setup is not None and {"venv", "jars", "bytecode"} <= set(setup.group(1).split())
    assert "sync --locked --compile-bytecode" in MAKEFILE  # the packages' bytecode, at build
    assert re.search(r"^test: setup ", MAKEFILE, re.MULTILINE), "make test runs setup"
    assert "$(UV_SYNC_FLAGS)" in MAKEFILE  # the flag reaches `uv sync --locked`
    copied = " ".join(instructions("COPY"))
    for needed in ("pyproject.toml", "uv.lock", "Makefile", "jars/pom.xml"):
        assert needed in copied, needed
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"][
        "targets"
    ]["wheel"]["packages"]
    for package in packages:
        assert f"COPY {package} {package}" in DOCKERFILE, package


def test_the_image_runs_as_non_root_with_the_python_the_lock_file_wants() -> None:
    assert "USER 10001:10001" in DOCKERFILE
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.11,<3.12" and "python3.11" in DOCKERFILE
    assert "openjdk-17-jre-headless" in DOCKERFILE  # Spark's JVM
    assert "PGSUB_JARS_DIR=/opt/pgsub/jars/lib" in DOCKERFILE  # resolved at build, not start


def test_the_chart_runs_the_image_as_it_is_meant_to() -> None:
    from subscriber.runtime.config import MetricsConfig

    (entrypoint,) = instructions("ENTRYPOINT")
    assert entrypoint.endswith('"pgsub"]')
    (command,) = instructions("CMD")
    statefulset = (
        ROOT / "deploy" / "helm" / "pgsub" / "templates" / "statefulset.yaml"
    ).read_text()
    assert 'args: ["run", "-c", "/etc/pgsub/pgsub.yaml"]' in statefulset
    assert command == '["run", "-c", "/etc/pgsub/pgsub.yaml"]'
    assert f"EXPOSE {MetricsConfig().port}" in DOCKERFILE
