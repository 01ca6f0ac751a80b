"""The run browser over HTTP (issue 21): every page and API answer, the checks on what a stranger sends, the
security headers, blobs, SQL downloads, the token, and how `steprec serve` starts and stops it. The same pages
in a real browser are in test_ui_browser.py."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.ui.serving import bind

from .ui_data import HOSTILE, TOKEN, Reply, fetch, png


def page(served, path: str) -> Reply:
    return fetch(served[0].ui_url.rstrip("/") + path)


def test_every_page_answers_with_the_recorded_runs(served) -> None:
    recorder, runs = served
    front = page(served, "/")
    assert front.status == 200 and "text/html" in front.headers["content-type"]
    for run_id in (runs.planner, runs.booker, runs.fork, runs.looker, runs.crashed):
        assert f'href="/runs/{run_id}"' in front.text
    for path in (f"/runs/{runs.planner}", f"/runs/{runs.planner}/tree", "/conversations", "/conversations/demo-trip",
                 "/recovery", "/sql", "/login", "/static/steprec.css", "/static/steprec.js"):  # fmt: skip
        assert page(served, path).status == 200, path


def test_runs_are_newest_first_filtered_and_paged(served) -> None:
    listed = page(served, "/api/runs").json()["runs"]
    starts = [run["started_at_ns"] for run in listed]
    assert starts == sorted(starts, reverse=True)
    failed = page(served, "/api/runs?outcome=failed").json()["runs"]
    assert failed and {run["outcome"] for run in failed} == {"failed"}
    booker = page(served, "/api/runs?agent=booker").json()["runs"]
    assert booker and {run["agent_name"] for run in booker} == {"booker"}
    trip = page(served, "/api/runs?conversation=demo-trip").json()["runs"]
    assert trip and {run["conversation_id"] for run in trip} == {"demo-trip"}
    newest = starts[0]
    assert page(served, "/api/runs?since=2000-01-01&until=2000-01-02").json()["runs"] == []
    assert page(served, "/api/runs?since=2000-01-01").json()["runs"][0]["started_at_ns"] == newest


def test_the_run_page_shows_lineage_transcript_commands_and_ledger(served) -> None:
    recorder, runs = served
    planner = page(served, f"/runs/{runs.planner}").text
    assert f'href="/runs/{runs.librarian}"' in planner  # its delegate
    assert "Lisbon: 21°C, sunny" in planner  # a tool return in the transcript
    assert f"steprec fork {runs.planner} --at " in planner and f"--endpoint {recorder.endpoint}" in planner
    assert "continue_run(client, run_id=" in planner
    librarian = page(served, f"/runs/{runs.librarian}").text
    assert f'id="parent-link" href="/runs/{runs.planner}"' in librarian
    fork = page(served, f"/runs/{runs.fork}").text
    assert f'id="fork-origin-link" href="/runs/{runs.booker}?snapshot=' in fork
    assert f'href="/runs/{runs.fork}"' in page(served, f"/runs/{runs.booker}").text  # the origin lists its fork
    crashed = page(served, f"/runs/{runs.crashed}").text
    assert "may or may not have happened" in crashed


def test_the_snapshot_picker_chooses_what_the_transcript_shows(served) -> None:
    runs = served[1]
    snapshots = page(served, f"/api/runs/{runs.planner}").json()["snapshots"]
    first, last = snapshots[0]["snapshot_index"], snapshots[-1]["snapshot_index"]
    early = page(served, f"/api/runs/{runs.planner}?snapshot={first}").json()
    late = page(served, f"/api/runs/{runs.planner}?snapshot={last}").json()
    assert early["snapshot"]["snapshot_index"] == first and late["snapshot"]["snapshot_index"] == last
    assert len(early["transcript"]["entries"]) < len(late["transcript"]["entries"])
    assert "continue_python" not in early["commands"] and f"at={first}" in early["commands"]["fork_python"]
    assert page(served, f"/runs/{runs.planner}?snapshot=9999").status == 404


def test_model_and_tool_text_is_escaped_and_no_inline_script_may_run(served) -> None:
    looker = page(served, f"/runs/{served[1].looker}")
    assert HOSTILE not in looker.text and "<script>window.__pwned" not in looker.text
    assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in looker.text
    policy = looker.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy.split("style-src")[0]
    assert looker.headers["x-content-type-options"] == "nosniff"
    assert re.fullmatch(r"app;dur=\d+\.\d+", looker.headers["server-timing"])
    assert not re.search(r"<script(?![^>]*\bsrc=)", looker.text)  # every script tag is a file from /static/


def test_images_are_served_from_the_media_store_with_their_type(served) -> None:
    looker = page(served, f"/runs/{served[1].looker}").text
    (href,) = set(re.findall(r'<img class="media" src="(/media/[0-9a-f]{64})"', looker))
    blob = page(served, href)
    assert blob.status == 200 and blob.body == png() and blob.headers["content-type"] == "image/png"
    assert "content-disposition" not in blob.headers and "sandbox" in blob.headers["content-security-policy"]
    assert page(served, "/media/" + "0" * 64).status == 404
    refused = page(served, "/media/not-a-digest")
    assert refused.status == 400 and "SHA-256" in refused.json()["error"]


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/?outcome=exploded", "outcome must be one of running, completed, failed"),
        ("/?since=yesterday", "since must be an ISO 8601 date"),
        ("/?after=zzz", "page token"),
        ("/?colour=red", "unknown query parameter(s) colour"),
        ("/?agent=a&agent=b", "more than once"),
        ("/runs/bad..id", "is not 1-200 of"),
        ("/runs/x?page=0", "page must be a whole number from 1"),
        ("/api/runs/x/below?offset=-1", "offset must be a whole number from 0"),
        ("/api/sql?q=DELETE%20FROM%20runs", "SELECT"),
        ("/api/sql?q=select%201&format=xlsx", "format must be one of json, csv, parquet"),
    ],
)
def test_bad_parameters_get_a_400_that_says_what_was_wrong(served, path: str, says: str) -> None:
    refused = page(served, path)
    assert refused.status == 400, (path, refused.status)
    shown = refused.json()["error"] if path.startswith("/api/") else refused.text
    assert says in shown.replace("&#39;", "'"), shown


def test_unknown_runs_and_conversations_are_404(served) -> None:
    for path in ("/runs/never-recorded", "/runs/never-recorded/tree", "/conversations/never-named"):
        missing = page(served, path)
        assert missing.status == 404 and "never-" in missing.text
    assert page(served, "/api/runs/never-recorded").json() == {"error": "no run 'never-recorded' was recorded"}


def test_the_tree_loads_a_level_at_a_time(served) -> None:
    runs = served[1]
    tree = page(served, f"/runs/{runs.planner}/tree").text
    assert f'href="/runs/{runs.librarian}"' in tree
    level = page(served, f"/api/runs/{runs.booker}/below").json()
    assert [run["run_id"] for run in level["runs"]] == [runs.fork] and level["next_offset"] is None
    assert level["runs"][0]["below"] == 1
    below = page(served, f"/api/runs/{runs.fork}/below").json()
    assert [(run["run_id"], run["below"]) for run in below["runs"]] == [(runs.refork, 0)]


def test_recovery_lists_failed_and_unresolved_runs(served) -> None:
    runs = served[1]
    listed = {run["run_id"]: run for run in page(served, "/api/recovery").json()["runs"]}
    assert listed[runs.booker]["outcome"] == "failed"
    assert listed[runs.crashed]["unresolved"] == 1
    assert runs.planner not in listed


def test_conversations_list_runs_in_order(served) -> None:
    listed = page(served, "/api/conversations").json()["conversations"]
    assert {"demo-trip", "conv-image", "conv-crash"} <= {c["conversation_id"] for c in listed}
    trip = page(served, "/conversations/demo-trip").text
    assert trip.index(served[1].planner) < trip.rindex("planner")
    assert 'id="head"' in trip and "Weekend in Lisbon" in trip and "Pack sunglasses" in trip  # its head's transcript
    heads = page(served, "/api/conversations").json()["heads"]
    assert [(head["conversation_id"], head["title"]) for head in heads] == [("demo-trip", "Weekend in Lisbon")]


def test_sql_shows_a_table_and_downloads_csv_and_parquet(served) -> None:
    query = quote("SELECT agent_name, count(*) AS runs FROM runs GROUP BY 1 ORDER BY 1")
    shown = page(served, f"/sql?q={query}")
    assert shown.status == 200 and "<td>planner</td>" in shown.text
    csv = page(served, f"/api/sql?format=csv&q={query}")
    assert csv.headers["content-disposition"].startswith("attachment") and b'"planner",2' in csv.body
    table = pq.read_table(io.BytesIO(page(served, f"/api/sql?format=parquet&q={query}").body))
    assert dict(zip(*table.to_pydict().values(), strict=True))["planner"] == 2
    nested = page(served, f"/api/sql?format=csv&q={quote('SELECT run_id, metadata FROM runs')}")
    assert nested.status == 200 and b"trip" in nested.body
    refused = page(served, f"/sql?q={quote('DROP TABLE runs')}")
    assert refused.status == 400 and "SELECT" in refused.text


def test_with_a_token_every_page_api_and_blob_needs_it(guarded: RecorderProcess) -> None:
    base = guarded.ui_url.rstrip("/")
    to_login = fetch(base + "/runs/x?snapshot=1")
    assert to_login.status == 303 and to_login.headers["location"] == "/login?next=%2Fruns%2Fx%3Fsnapshot%3D1"
    assert fetch(base + "/api/runs").status == 401 and fetch(base + "/media/" + "0" * 64).status == 401
    assert fetch(base + "/api/runs", headers={"Authorization": "Bearer wrong"}).status == 401
    assert fetch(base + "/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status == 200
    assert fetch(base + "/login").status == 200 and fetch(base + "/static/steprec.css").status == 200


def test_signing_in_keeps_the_token_in_a_strict_http_only_cookie(guarded: RecorderProcess) -> None:
    base = guarded.ui_url.rstrip("/")
    wrong = fetch(base + "/login", data=b"token=nope&next=%2Frecovery")
    assert wrong.status == 401 and "not this recorder" in wrong.text and "set-cookie" not in wrong.headers
    signed = fetch(base + "/login", data=f"token={TOKEN}&next=%2Frecovery".encode())
    assert signed.status == 303 and signed.headers["location"] == "/recovery"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    session = cookie.split(";", 1)[0]
    assert fetch(base + "/recovery", headers={"Cookie": session}).status == 200
    elsewhere = fetch(base + "/login", data=f"token={TOKEN}&next=//evil.example/".encode())
    assert elsewhere.headers["location"] == "/"  # never a redirect off this site
    assert fetch(base + "/login", data=b"token=" + b"x" * 9000).status == 400


def test_off_serves_no_browser_and_a_port_asked_for_that_is_taken_is_an_error(tmp_path: Path) -> None:
    with RecorderProcess(tmp_path / "off", ui_listen="off") as off:
        assert off.ui_url == ""
    taken = bind("127.0.0.1:0")
    address = f"127.0.0.1:{taken.getsockname()[1]}"
    try:
        refused = RecorderProcess(tmp_path / "busy", ui_listen=address)
        with pytest.raises(RuntimeError, match=f"the browser cannot listen on {address}"):
            refused.start()
    finally:
        taken.close()


def test_a_bad_ui_listen_value_is_refused_with_the_reason(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "steprec.recorder", "serve", "--data", str(tmp_path), "--ui-listen", "everywhere"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0 and "--ui-listen: 'everywhere' is not HOST:PORT or off" in done.stderr


PAGES = ["/", "/runs/{run}", "/runs/{run}/tree", "/conversations", "/conversations/{text}", "/recovery", "/sql",
         "/api/runs", "/api/runs/{run}", "/api/runs/{run}/below", "/api/conversations", "/api/recovery", "/api/sql",
         "/media/{text}", "/login"]  # fmt: skip
NAMES = ["agent", "conversation", "outcome", "since", "until", "after", "snapshot", "page", "offset", "q", "format",
         "next", "x"]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(path="/media/{text}", segment="0/", query=[])  # an encoded slash once got a redirect to another path
@example(path="/conversations/{text}", segment="/", query=[])
@given(
    path=st.sampled_from(PAGES),
    segment=st.text(min_size=1, max_size=40),
    query=st.lists(st.tuples(st.sampled_from(NAMES), st.text(max_size=40)), max_size=4),
)
def test_whatever_a_stranger_sends_is_answered_without_a_server_error(served, path, segment, query) -> None:
    """Random paths and parameters: a page, a 400 or a 404 (or a sign-in redirect), never a 500; and the
    browser keeps serving everyone else."""
    url = path.format(run=quote(segment, safe=""), text=quote(segment, safe=""))
    if query:
        url += "?" + "&".join(f"{quote(name)}={quote(value, safe='')}" for name, value in query)
    answer = page(served, url)
    assert answer.status in (200, 303, 400, 404), (url, answer.status, answer.body[:300])
    assert page(served, "/api/recovery").status == 200
