"""The `steprec` command. Subcommands come from every installed steprec part.

Each part registers an `argparse` hook under the `steprec.commands` entry-point
group, so `steprec serve` exists where the recorder is installed and the query
commands wherever the client is, without the parts importing each other.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="steprec", description="Record, resume and inspect pydantic-ai agent runs.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry_point in sorted(entry_points(group="steprec.commands"), key=lambda e: e.name):
        entry_point.load()(commands)
    return parser


EXIT_CODES = ((LookupError, 3), (ConnectionError, 4), (PermissionError, 5), (ValueError, 2))
"""Exit codes scripts can rely on: not found 3, recorder unreachable 4, refused 5, bad value 2, else 1."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(argv)
    try:
        return options.run(options) or 0
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # a person gets a sentence, not a traceback
        print(f"steprec {options.command}: {error}", file=sys.stderr)
        return next((code for kind, code in EXIT_CODES if isinstance(error, kind)), 1)


if __name__ == "__main__":
    sys.exit(main())
