"""A headless Chromium for the page's tests: Debian's `chromium` driven by playwright.

    with open_page("http://127.0.0.1:9465/") as tab:
        tab.wait_loaded()
        assert tab.page.text_content("#worst-queries tbody tr") ...
    assert not tab.errors

Playwright comes from PyPI with its driver but no browser; it launches the system's Chromium
(`executable_path`), so nothing is downloaded (`playwright install` is never run). Without a
Chromium the tests skip, except under CI, where a missing browser is a failure: .ci/run installs it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import ConsoleMessage, Error, Page, sync_playwright

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
HANDLED_STATUS = "Failed to load resource: the server responded with a status of 4"


def chromium_path() -> str:
    """The system Chromium, or skip (fail under CI)."""
    found = os.environ.get("STREAM_NDCG_CHROMIUM") or next((p for p in CANDIDATES if Path(p).is_file()), None) \
        or shutil.which("chromium")
    if found is None:
        message = "no chromium: apt-get install chromium (or set STREAM_NDCG_CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


@dataclass
class Tab:
    """One page, with what went wrong in it: console errors (a CSP refusal is one) and uncaught exceptions."""

    page: Page
    errors: list[str] = field(default_factory=list)

    def wait_loaded(self, times: int = 1, timeout_ms: float = 20_000) -> None:
        """Until the page has finished `times` rounds of loading (app.js counts them on body[data-loaded])."""
        self.page.wait_for_function("n => Number(document.body.dataset.loaded || 0) >= n", arg=times,
                                    timeout=timeout_ms)

    def loads(self) -> int:
        return int(self.page.evaluate("Number(document.body.dataset.loaded || 0)"))

    def after(self, action: Callable[[], object]) -> None:
        """Do `action` (a click, a new fragment) and wait until the page has loaded what it asked for."""
        before = self.loads()
        action()
        self.wait_loaded(before + 1)


@contextmanager
def open_page(url: str, downloads: bool = True) -> Iterator[Tab]:
    """A fresh headless Chromium with one tab at `url` (not yet loaded: call `wait_loaded`)."""
    executable = chromium_path()
    with sync_playwright() as playwright:
        # No sandbox: the tests may run as root in a container, where Chromium's sandbox cannot start.
        browser = playwright.chromium.launch(executable_path=executable, headless=True,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            context = browser.new_context(accept_downloads=downloads, viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            tab = Tab(page)

            def on_console(message: ConsoleMessage) -> None:
                # An answer of 401 or 400 is one the page handles (token form, message); Chromium
                # logs it all the same.
                if message.type == "error" and not message.text.startswith(HANDLED_STATUS):
                    tab.errors.append(message.text)

            def on_page_error(error: Error) -> None:
                tab.errors.append(f"uncaught: {error}")

            page.on("console", on_console)
            page.on("pageerror", on_page_error)
            page.goto(url)
            yield tab
        finally:
            browser.close()
