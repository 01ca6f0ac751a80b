"""The run browser in a real browser (issue 21): Debian's Chromium, headless, driven by Playwright.

Each page loads with no console error (a Content-Security-Policy violation is one), the links lead where they
say, the transcript shows tool returns and the image, the snapshot picker changes the transcript, the commands
are shown, the tree opens a level on demand, the hostile tool return stays text, and the token is enforced
through the sign-in page. With STEPREC_SCREENSHOTS=<folder> each page is also saved there (docs/img/ holds
the ones docs/ui.md shows).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

from .ui_data import HOSTILE, TOKEN

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# As the machine's own check starts it: no sandbox (root in a container), and nothing that calls out.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Chromium is missing: `python3 scripts/dev.py test` installs Debian's chromium"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def tab(browser: Browser) -> Iterator[tuple[Page, list[str]]]:
    """A fresh page, and the console errors and page errors it collects."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            problems.append(f"console: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    yield page, problems
    context.close()


def _shot(page: Page, name: str) -> None:
    if folder := os.environ.get("STEPREC_SCREENSHOTS"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / f"ui-{name}.png"), full_page=False)


def test_every_page_loads_without_a_console_error(served, tab) -> None:
    recorder, runs = served
    page, problems = tab
    base = recorder.ui_url.rstrip("/")
    for name, path in [
        ("runs", "/"),
        ("run", f"/runs/{runs.planner}"),
        ("tree", f"/runs/{runs.booker}/tree"),
        ("conversations", "/conversations"),
        ("conversation", "/conversations/demo-trip"),
        ("recovery", "/recovery"),
        ("sql", "/sql?q=SELECT%20agent_name%2C%20count(*)%20AS%20runs%20FROM%20runs%20GROUP%20BY%201%20ORDER%20BY%201"),
        ("image", f"/runs/{runs.looker}"),
        ("unresolved", f"/runs/{runs.crashed}"),
    ]:
        response = page.goto(base + path)
        assert response is not None and response.status == 200, path
        page.wait_for_load_state("networkidle")
        _shot(page, name)
    assert problems == []


def test_links_lead_where_they_say(served, tab) -> None:
    recorder, runs = served
    page, problems = tab
    page.goto(recorder.ui_url)
    page.click(f'table.runs a.run[href="/runs/{runs.librarian}"]')
    expect(page.locator("#run-id")).to_have_text(runs.librarian)
    page.click("#parent-link")
    expect(page.locator("#run-id")).to_have_text(runs.planner)
    page.click("#conversation-link")
    expect(page.locator("#conversation-id")).to_have_text("demo-trip")
    page.click("#nav-recovery")
    page.click(f'a.run[href="/runs/{runs.crashed}"]')
    expect(page.locator("#effects")).to_contain_text("may or may not have happened")
    page.goto(f"{recorder.ui_url}runs/{runs.fork}")
    page.click("#fork-origin-link")
    expect(page.locator("#run-id")).to_have_text(runs.booker)
    page.click("#nav-sql")
    page.fill("#query", "SELECT count(*) AS failed FROM runs WHERE outcome = 'failed'")
    page.click("#run-query")
    expect(page.locator("#result td")).to_have_text("1")
    assert problems == []


def test_the_transcript_shows_tool_returns_the_image_and_the_commands(served, tab) -> None:
    recorder, runs = served
    page, problems = tab
    page.goto(f"{recorder.ui_url}runs/{runs.planner}")
    expect(page.locator(".entry.tool-return").first).to_contain_text("Lisbon: 21°C, sunny")
    expect(page.locator("#fork-cli")).to_contain_text(f"steprec fork {runs.planner} --at ")
    expect(page.locator("#fork-python")).to_contain_text("await fork_run(client")
    page.goto(f"{recorder.ui_url}runs/{runs.looker}")
    image = page.locator("img.media")
    expect(image).to_have_count(1)
    assert image.evaluate("img => img.complete && img.naturalWidth") == 96  # the PNG, from /media/
    assert problems == []


def test_the_snapshot_picker_changes_the_transcript(served, tab) -> None:
    recorder, runs = served
    page, problems = tab
    page.goto(f"{recorder.ui_url}runs/{runs.planner}")
    entries = page.locator(".transcript .entry").count()
    first = page.locator("#snapshot-select option").first.get_attribute("value")
    with page.expect_navigation():
        page.select_option("#snapshot-select", first)  # the page's script submits the picker on change
    expect(page.locator("#snapshot-info")).to_contain_text(f"Snapshot #{first} ")
    assert page.locator(".transcript .entry").count() < entries
    expect(page.locator("#fork-cli")).to_contain_text(f"--at {first} ")
    assert problems == []


def test_the_tree_opens_a_level_when_asked(served, tab) -> None:
    recorder, runs = served
    page, problems = tab
    page.goto(f"{recorder.ui_url}runs/{runs.booker}/tree")
    fork = page.locator(f'li.node[data-run="{runs.fork}"]')
    expect(fork.locator("a.run")).to_be_visible()
    expect(page.locator(f'li.node[data-run="{runs.refork}"]')).to_have_count(0)  # not loaded until opened
    fork.locator("button.toggle").click()
    expect(fork.locator(f'ul.level li.node[data-run="{runs.refork}"] a.run')).to_have_text(runs.refork)
    _shot(page, "tree-open")
    fork.locator("button.toggle").click()
    expect(fork.locator("ul.level")).to_be_hidden()
    page.click(f'a.reroot[href="/runs/{runs.fork}/tree"]')
    expect(page.locator("h1")).to_contain_text(runs.fork)
    page.goto(f"{recorder.ui_url}runs/{runs.planner}/tree")
    expect(page.locator(f'li.node[data-run="{runs.librarian}"]')).to_be_visible()
    assert problems == []


def test_a_script_in_a_tool_return_stays_text(served, tab) -> None:
    recorder, runs = served
    page, problems = tab
    page.goto(f"{recorder.ui_url}runs/{runs.looker}")
    page.wait_for_load_state("networkidle")
    expect(page.locator(".entry.tool-return pre.text")).to_have_text(HOSTILE)
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator('.transcript img[src="x"]').count() == 0
    assert problems == []


def test_the_token_is_enforced_through_the_sign_in_page(guarded, tab) -> None:
    page, problems = tab
    page.goto(guarded.ui_url + "recovery")
    assert page.url.startswith(guarded.ui_url + "login?next=")
    page.fill("#token", "not-the-token")
    page.click("#sign-in")
    expect(page.locator("#login-error")).to_contain_text("not this recorder")
    page.fill("#token", TOKEN)
    page.click("#sign-in")
    assert page.url == guarded.ui_url + "recovery"
    expect(page.locator("h1")).to_contain_text("Recovery")
    cookie = next(c for c in page.context.cookies() if c["name"] == "steprec_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert page.evaluate("() => document.cookie") == ""  # script cannot read it
    page.click("text=Sign out")
    page.goto(guarded.ui_url)
    assert "/login" in page.url
    problems[:] = [p for p in problems if "401" not in p]  # the refused sign-in answered 401, as it should
    assert problems == []
