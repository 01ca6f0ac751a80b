"""Installing and configuring RecorderStepStore: the optional extra, the lazy import, the options."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
import steprec.query
from steprec.query import RecorderStepStore


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_steprec_query_imports_without_the_harness_and_says_what_to_install() -> None:
    result = _python(
        "import sys; sys.modules['pydantic_ai_harness'] = None\n"
        "import steprec.query\n"
        "from steprec.query import RecorderClient, continue_run\n"
        "try:\n"
        "    from steprec.query import RecorderStepStore\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'steprec-query[harness]'" in result.stdout


def test_the_store_loads_only_when_asked_for() -> None:
    result = _python(
        "import sys, steprec.query\n"
        "print('pydantic_ai_harness' in sys.modules, 'steprec.exporter' in sys.modules)\n"
        "steprec.query.RecorderStepStore\n"
        "print('pydantic_ai_harness' in sys.modules)\n"
    )
    assert result.stdout.split() == ["False", "False", "True"], result.stderr
    with pytest.raises(AttributeError, match="NoSuchThing"):
        steprec.query.NoSuchThing  # noqa: B018


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_snapshots_per_run": 0}, "max_snapshots_per_run must be >= 1"),
        ({"max_snapshots_per_run": 1.5}, "max_snapshots_per_run must be an int"),
        ({"max_snapshots_per_run": "3"}, "max_snapshots_per_run must be an int"),
        ({"endpoint": "not an endpoint"}, "endpoint"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_bad_options_are_refused_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RecorderStepStore(**options)


def test_endpoint_defaults_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STEPREC_ENDPOINT", "recorder.internal:4317")
    store = RecorderStepStore(max_snapshots_per_run=None)
    assert store.endpoint == "recorder.internal:4317" and store.max_snapshots_per_run is None
    assert RecorderStepStore("127.0.0.1:9", max_snapshots_per_run=1).max_snapshots_per_run == 1
