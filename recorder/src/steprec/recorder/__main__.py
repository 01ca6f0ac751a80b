"""`python -m steprec.recorder serve ...`: the daemon without the `steprec` command on PATH."""

import sys

from steprec.query.cli import main

sys.exit(main())
