"""One entry point for a fresh machine: `python3 scripts/dev.py demo` or `python3 scripts/dev.py test`.

Creates `.venv` beside the repository (once, and again whenever a
pyproject.toml or constraints.txt changes), installs the four parts editable
with the pinned versions in constraints.txt plus the dev tools listed in the
root pyproject.toml, then runs the demo or the whole test suite in it.

`test` then runs tests/harness in a second venv, `.venv-harness`: the same
parts plus `steprec-query[harness]` and the pydantic-ai-harness release it is
tested against, which pins its own pydantic-ai (so no constraints.txt there).
Arguments after `test` go to the main suite; `test-harness [args]` runs only
the harness suite, with them. Needs only Python 3.11+ and the package index.
The tests start Chromium, nginx and PostgreSQL: where one is missing, `test`
installs its Debian package with apt-get (as root, or through sudo), once.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
HARNESS_VENV = ROOT / ".venv-harness"
PARTS = ["proto", "exporter", "recorder[demo,lake]", "query"]
HARNESS_PARTS = ["proto", "exporter", "recorder", "query[harness]"]
HARNESS = "pydantic-ai-harness==0.62.0"
PART_PROJECTS = [ROOT / p.split("[")[0] / "pyproject.toml" for p in PARTS]
INPUTS = [ROOT / "pyproject.toml", ROOT / "constraints.txt", *PART_PROJECTS]
HARNESS_INPUTS = [ROOT / "pyproject.toml", *PART_PROJECTS]


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
        # A current pip: the one bundled with Python 3.11 cannot resolve an editable part with extras
        # (`query[harness]`) that another part also requires.
        venv.create(folder, with_pip=True, upgrade_deps=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *install_args], check=True)
    stamp.write_text(fingerprint)
    return python


def _dev_tools() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]


def _editable(parts: list[str]) -> list[str]:
    """`-e <folder>[extras]` for each part."""
    return [arg for part in parts for arg in ("-e", str(ROOT / part.split("[")[0]) + part[len(part.split("[")[0]) :])]


def ensure_environment() -> Path:
    """The dev venv's python: the four parts editable, pinned by constraints.txt, plus the dev tools."""
    return ensure_venv(VENV, ["-c", str(ROOT / "constraints.txt"), *_editable(PARTS), *_dev_tools()], INPUTS)


def ensure_harness_environment() -> Path:
    """The harness venv's python: the parts editable, `steprec-query[harness]`, the harness and pytest."""
    pytest_tools = [tool for tool in _dev_tools() if tool.startswith("pytest")]
    return ensure_venv(HARNESS_VENV, [*_editable(HARNESS_PARTS), HARNESS, *pytest_tools], HARNESS_INPUTS)


SYSTEM_PACKAGES = {
    "chromium": ["chromium"],
    "nginx": ["nginx", "/usr/sbin/nginx"],
    "postgresql": ["/usr/lib/postgresql/*/bin/initdb"],
}
"""The Debian packages whose programs the tests start, and where each program may be: the run browser's tests
drive Chromium, tests/test_balancer.py runs docker/nginx-grpc.conf with nginx, the lake tests start
PostgreSQL (whose programs Debian keeps off PATH)."""


def _installed(places: list[str]) -> bool:
    return any(glob.glob(place) if "/" in place else shutil.which(place) for place in places)


def ensure_system_packages() -> None:
    """Install the Debian packages whose programs are missing; say so (the tests then fail, naming it) where
    that cannot be done here."""
    missing = sorted(package for package, places in SYSTEM_PACKAGES.items() if not _installed(places))
    if not missing:
        return
    if shutil.which("apt-get") is None:
        print(f"steprec: the tests need {', '.join(missing)}; install it (no apt-get here)", flush=True)
        return
    root = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if root is None:
        print(f"steprec: the tests need {', '.join(missing)}; install it as root", flush=True)
        return
    print(f"steprec: installing {', '.join(missing)} (Debian packages) for the tests ...", flush=True)
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*root, "apt-get", "install", "-y", "-q", *missing]
    if subprocess.run(install, env=environment, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run([*root, "apt-get", "update", "-q"], env=environment, stdout=subprocess.DEVNULL)
        subprocess.run(install, env=environment, stdout=subprocess.DEVNULL)


def _pytest(python: Path, args: list[str]) -> int:
    return subprocess.call([str(python), "-m", "pytest", *args], cwd=ROOT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "test-harness"}:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "test-harness":
        return _pytest(ensure_harness_environment(), ["tests/harness", *rest])
    python = ensure_environment()
    if command == "demo":
        return subprocess.call([str(python), "-m", "steprec.recorder", "demo", *rest])
    ensure_system_packages()
    main_suite = _pytest(python, rest)
    harness_suite = _pytest(ensure_harness_environment(), ["tests/harness"])
    return main_suite or harness_suite


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
