"""One entry point for a fresh machine: `python3 scripts/dev.py demo` or `python3 scripts/dev.py test`.

Creates `.venv` beside the repository (once, and again whenever a
pyproject.toml or constraints.txt changes), installs the four parts editable
with the pinned versions in constraints.txt plus the dev tools listed in the
root pyproject.toml, then runs the demo or the whole test suite in it.
Needs only Python 3.11+ and the package index.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
PARTS = ["proto", "exporter", "recorder[demo]", "query"]
INPUTS = [
    ROOT / "pyproject.toml",
    ROOT / "constraints.txt",
    *(ROOT / p.split("[")[0] / "pyproject.toml" for p in PARTS),
]


def venv_python(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv(folder: Path, install_args: list[str], inputs: list[Path]) -> Path:
    """`folder`'s python, (re)installing `install_args` with pip when any of `inputs` changed since."""
    stamp = folder / ".steprec-installed"
    digest = hashlib.sha256("\0".join(install_args).encode())
    for path in inputs:
        digest.update(path.read_bytes())
    fingerprint = digest.hexdigest()
    python = venv_python(folder)
    if stamp.exists() and stamp.read_text() == fingerprint and python.exists():
        return python
    print(f"steprec: preparing {folder.name} (first run, or dependencies changed) ...", flush=True)
    if not python.exists():
        venv.create(folder, with_pip=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *install_args], check=True)
    stamp.write_text(fingerprint)
    return python


def ensure_environment() -> Path:
    """The dev venv's python: the four parts editable, pinned by constraints.txt, plus the dev tools."""
    dev_tools = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    editable = [
        arg for part in PARTS for arg in ("-e", str(ROOT / part.split("[")[0]) + part[len(part.split("[")[0]) :])
    ]
    return ensure_venv(VENV, ["-c", str(ROOT / "constraints.txt"), *editable, *dev_tools], INPUTS)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test"}:
        print(__doc__, file=sys.stderr)
        return 2
    python = ensure_environment()
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return subprocess.call([str(python), "-m", "steprec.recorder", "demo", *rest])
    return subprocess.call([str(python), "-m", "pytest", *rest], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
