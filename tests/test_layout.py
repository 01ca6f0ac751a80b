"""The shape of the project: four distributions under one namespace, a light exporter, current generated code."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = {
    "proto": "steprec-proto",
    "exporter": "steprec-exporter",
    "recorder": "steprec-recorder",
    "query": "steprec-query",
}


def test_each_part_is_its_own_distribution_under_the_steprec_namespace() -> None:
    for folder, name in PARTS.items():
        project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
        assert project["name"] == name
        package = ROOT / folder / "src" / "steprec" / folder
        assert (package / "__init__.py").exists()
        # An implicit namespace: no part may own steprec/__init__.py.
        assert not (ROOT / folder / "src" / "steprec" / "__init__.py").exists()


def test_exporter_does_not_depend_on_the_database() -> None:
    dependencies = tomllib.loads((ROOT / "exporter" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in dependencies if d.lower().startswith(("duckdb", "pyarrow", "steprec-recorder"))]
    # And importing it, then recording, pulls neither in.
    probe = (
        "import sys, steprec.exporter, pydantic_ai;"
        "bad = sorted(m for m in ('duckdb', 'pyarrow') if m in sys.modules);"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_recorder_pins_what_it_ships_with() -> None:
    dependencies = tomllib.loads((ROOT / "recorder" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert all("==" in d for d in dependencies), dependencies
    assert "duckdb==1.5.5" in dependencies


def test_generated_protobuf_modules_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_proto.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
