"""The drill-down page in a real Chromium against canned API answers (no Kafka, no Redis): hostile ids
shown as text and never run, the token form, the fragment's state, sorting, the views, a query's
detail and the judging queue's download.

The canned answers follow /api/v1's contract; the page's files and the response headers (the
Content-Security-Policy among them) are the real ones, so an inline style or script in the page
shows up as a console error here.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest
from playwright.sync_api import Page

from stream_ndcg.drilldown.api import HEADERS, judging_queue_csv, page_file
from tests.support.browser import Tab, open_page

pytestmark = pytest.mark.browser

TOKEN = "page-Token-42"
SCRIPT_ID = "<script>window.pwned=1</script>"
IMG_ID = '<img src=x onerror="window.pwned=1">'
NOW = 1_700_000_000_000
REFUSED = "vs: the 1h before this one is behind the retention horizon (1h10m): raise grace to serve it"


def query_row(query_id: str, ndcg: float | None, impressions: int, vs: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"query_id": query_id, "impressions": impressions, "scored_impressions": impressions - 1,
                           "ndcg": ndcg, "dcg": None if ndcg is None else ndcg * 3, "judged_ratio": 0.5,
                           "vs": None, "change": None}
    if vs:
        row["vs"] = {"impressions": impressions + 5, "scored_impressions": impressions, "ndcg": 0.7, "dcg": 2.1,
                     "judged_ratio": 0.6}
        row["change"] = {"impressions": -5, "ndcg": None if ndcg is None else ndcg - 0.7,
                         "dcg": None if ndcg is None else ndcg * 3 - 2.1, "judged_ratio": -0.1}
    return row


def summary(window: str) -> dict[str, Any]:
    def row(variant: str, ndcg: float) -> dict[str, Any]:
        return {"segment": {"variant": variant}, "impressions": 100,
                "k": {k: {"ndcg_mean": ndcg, "dcg_mean": ndcg * 3, "judged_ratio": 0.4, "scored_impressions": 90}
                      for k in ("5", "10")}}
    return {"window": window, "windows": ["1m", "5m", "1h"], "cutoffs": [5, 10], "segment_labels": ["variant"],
            "now_ms": NOW, "buckets": [10, 20], "rows": [row("A", 0.71), row("B", 0.62), row(SCRIPT_ID, 0.5)]}


def queries(params: dict[str, str]) -> dict[str, Any]:
    vs = params.get("vs") or None
    rows = [query_row(SCRIPT_ID, 0.1, 40, bool(vs)), query_row(IMG_ID, 0.2, 30, bool(vs)),
            query_row("q-plain", 0.3, 20, bool(vs)), query_row("q-null", None, 3, bool(vs))]
    return {"window": params.get("window", "1m"), "k": int(params.get("k", "10")),
            "segment": {k.removeprefix("segment."): v for k, v in params.items() if k.startswith("segment.")},
            "vs": vs, "sort": params.get("sort", "ndcg"), "order": params.get("order", "asc"),
            "limit": int(params.get("limit", "50")), "offset": int(params.get("offset", "0")), "total": len(rows),
            "now_ms": NOW, "buckets": [10, 20],
            "vs_buckets": [0, 9] if vs == "previous" else None, "queries": rows}


def detail(query_id: str, params: dict[str, str]) -> dict[str, Any]:
    return {"query_id": query_id, "window": params.get("window", "1m"), "cutoffs": [5, 10], "ideal": "pool",
            "gain": "exponential", "now_ms": NOW,
            "summary": {"impressions": 40, "k": {"5": {"ndcg": 0.1, "dcg": 0.3, "judged_ratio": 0.5,
                                                       "scored_impressions": 39},
                                                 "10": {"ndcg": 0.1, "dcg": 0.3, "judged_ratio": 0.5,
                                                        "scored_impressions": 39}}},
            "lists": [{"impressions": 30, "segments": [{"segment": {"variant": "B"}, "impressions": 30}],
                       "results": [{"rank": 1, "doc_id": IMG_ID, "grade": None, "source": None},
                                   {"rank": 2, "doc_id": "d-neg", "grade": -1.0, "source": "raters"},
                                   {"rank": 3, "doc_id": "d-good", "grade": 3.0, "source": "coec"}],
                       "dcg": {"5": 3.5, "10": 3.5}, "ndcg": {"5": 0.5, "10": None},
                       "ideal_dcg": {"5": 7.0, "10": 7.0}},
                      {"impressions": 10, "segments": [{"segment": {"variant": "A"}, "impressions": 10}],
                       "results": [{"rank": 1, "doc_id": "d-good", "grade": 3.0, "source": "coec"}],
                       "dcg": {"5": 7.0, "10": 7.0}, "ndcg": {"5": 1.0, "10": 1.0},
                       "ideal_dcg": {"5": 7.0, "10": 7.0}}],
            "lists_total": 2,
            "ideal_ordering": [{"doc_id": "d-good", "grade": 3.0, "source": "coec",
                                "source_grades": {"raters": None, "coec": 3.0, "sdbn": 1.0}},
                               {"doc_id": "d-neg", "grade": -1.0, "source": "raters",
                                "source_grades": {"raters": -1.0}}],
            "ideal_dcg": {"5": 7.0, "10": 7.0},
            "judgments": {"d-good": [{"ts": NOW - 5000, "event_id": "j1", "grade": 2.0, "source": "raters"},
                                     {"ts": NOW - 1000, "event_id": "j2", "grade": 3.0, "source": "coec"}],
                          IMG_ID: [{"ts": NOW - 3000, "event_id": SCRIPT_ID, "grade": 1.0, "source": "raters"},
                                   {"ts": NOW - 2000, "event_id": "j4", "grade": None, "source": "raters"}]},
            "clicks": {"available": True, "reason": None, "model": "coec", "documents": {
                IMG_ID: {"grade": 0.0, "ts": NOW - 3_600_000, "score": 0.25, "other_grades": {},
                         "evidence": {"impressions": 40, "clicks": 1, "expected_clicks": 4.0}},
                "d-good": {"grade": 3.0, "ts": NOW - 3_600_000, "score": 2.0,
                           "other_grades": {"raters": None, "sdbn": 1.0},
                           "evidence": {"impressions": 20, "clicks": 6, "expected_clicks": 3.0}}}}}


PAIRS = [{"query_id": SCRIPT_ID, "doc_id": IMG_ID, "exposure": 30.0, "share": 0.5, "best_rank": 1,
          "query_impressions": 40, "query_judged_ratio": 0.5},
         {"query_id": "=cmd|' /C calc'!A0", "doc_id": "d2", "exposure": 12.5, "share": 0.25, "best_rank": 2,
          "query_impressions": 20, "query_judged_ratio": None}]


@dataclass
class Canned:
    """The canned API: what it was asked (path, parameters, authorization header), in order."""

    port: int = 0
    asked: list[tuple[str, dict[str, str], str | None]] = field(default_factory=list)

    def last(self, path: str) -> dict[str, str]:
        return next(params for asked, params, _ in reversed(self.asked) if asked == path)


@pytest.fixture
def canned() -> Iterator[Canned]:
    record = Canned()
    pages = {"/": ("index.html", "text/html; charset=utf-8"), "/app.js": ("app.js", "text/javascript"),
             "/app.css": ("app.css", "text/css")}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            parts = urlsplit(self.path)
            if parts.path in pages:
                name, kind = pages[parts.path]
                body = page_file(name)
                assert body is not None, f"stream_ndcg/drilldown/page/{name} is not in the package"
                self.send(200, body, kind)
                return
            params = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            authorization = self.headers.get("Authorization")
            record.asked.append((parts.path, params, authorization))
            if authorization != f"Bearer {TOKEN}":
                self.send(401, b'{"error": "authorization: a bearer token is required"}', "application/json")
                return
            if parts.path == "/api/v1/summary":
                answer: Any = summary(params.get("window", "1m"))
            elif parts.path == "/api/v1/queries":
                if params.get("vs") == "previous" and params.get("window") == "1h":
                    self.send(400, json.dumps({"error": REFUSED}).encode(), "application/json")
                    return
                answer = queries(params)
            elif parts.path.startswith("/api/v1/queries/"):
                answer = detail(unquote(parts.path.removeprefix("/api/v1/queries/")), params)
            elif parts.path == "/api/v1/judging-queue":
                if params.get("format") == "csv":
                    self.send(200, judging_queue_csv(PAIRS).encode(), "text/csv; charset=utf-8")
                    return
                answer = {"window": params.get("window", "1m"), "k": int(params.get("k", "10")), "segment": {},
                          "total_exposure": 60.0, "now_ms": NOW, "pairs": PAIRS}
            else:
                self.send(404, b'{"error": "path: no such route"}', "application/json")
                return
            self.send(200, json.dumps(answer).encode(), "application/json")

        def send(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in HEADERS.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            """Quiet."""

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    record.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()


def text(page: Page, selector: str) -> str:
    return page.text_content(selector) or ""


def signed_in(tab: Tab) -> None:
    """The first API answer is a 401: the page asks for the token, then loads."""
    tab.page.wait_for_selector("#token-form:not([hidden])")
    tab.page.fill("#token-input", TOKEN)
    tab.after(lambda: tab.page.click("#token-form button[type=submit]"))
    assert tab.page.is_hidden("#token-form")


def test_hostile_ids_are_text_and_never_run(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/") as tab:
        signed_in(tab)
        page = tab.page
        ids = page.eval_on_selector_all("#worst-queries tbody tr[data-query-id]",
                                        "rows => rows.map(r => r.dataset.queryId)")
        assert ids == [SCRIPT_ID, IMG_ID, "q-plain", "q-null"]
        shown = page.eval_on_selector_all("#worst-queries tbody tr td.id", "cells => cells.map(c => c.textContent)")
        assert shown == ids
        # The segment value that is markup too: an option's text and a row of the summary.
        assert SCRIPT_ID in page.eval_on_selector_all("#segment-variant option", "os => os.map(o => o.textContent)")
        assert SCRIPT_ID in text(page, "#summary-table tbody")

        tab.after(lambda: page.locator("#worst-queries tbody tr[data-query-id]").nth(1).locator("a").click())
        assert page.text_content("#detail-query-id") == IMG_ID
        assert IMG_ID in text(page, "#detail-lists")
        assert SCRIPT_ID in text(page, "#judgment-history")
        assert SCRIPT_ID in text(page, "#judging-queue tbody")

        assert page.evaluate("typeof window.pwned") == "undefined"
        # No element came from the data: only the page's own script, and no image at all.
        assert page.evaluate("document.querySelectorAll('img').length") == 0
        assert page.eval_on_selector_all("script", "ss => ss.map(s => s.getAttribute('src'))") == ["app.js"]
    assert tab.errors == []


def test_sorting_views_and_the_fragment(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/#window=5m&segment.variant=B") as tab:
        signed_in(tab)
        page = tab.page
        first = canned.last("/api/v1/queries")
        assert (first["window"], first["segment.variant"], first["sort"], first["order"]) == ("5m", "B", "ndcg", "asc")
        assert "vs" not in first
        assert page.input_value("#window-select") == "5m"
        assert page.input_value("#segment-variant") == "B"

        tab.after(lambda: page.click("#worst-queries th[data-sort=impressions]"))
        asked = canned.last("/api/v1/queries")
        assert (asked["sort"], asked["order"], asked["offset"]) == ("impressions", "desc", "0")
        assert "sort=impressions" in page.evaluate("location.hash")
        assert page.get_attribute("#worst-queries th[data-sort=impressions]", "aria-sort") == "descending"
        tab.after(lambda: page.click("#worst-queries th[data-sort=impressions]"))
        assert canned.last("/api/v1/queries")["order"] == "asc"
        tab.after(lambda: page.click("#worst-queries th[data-sort=judged_ratio]"))
        asked = canned.last("/api/v1/queries")
        assert (asked["sort"], asked["order"]) == ("judged_ratio", "asc")

        tab.after(lambda: page.click("#view-movers"))
        asked = canned.last("/api/v1/queries")
        assert (asked["vs"], asked["sort"], asked["order"]) == ("previous", "change_ndcg", "asc")
        # A fall in nDCG is coloured as worse; the change with nothing to compare is a dash.
        changes = page.eval_on_selector_all("#worst-queries tbody tr", """rows => rows.map(r =>
            [...r.cells].find((c, i) => r.closest('table').tHead.rows[0].cells[i].dataset.sort === 'change_ndcg'))
            .map(c => [c.textContent, c.className])""")
        assert changes[0] == ["\u22120.6000", "num worse"]
        assert changes[3] == ["\u2014", "num"]

        # The count read before the change: a load that ends before the wait must still count.
        tab.after(lambda: page.select_option("#compare-select", "variant:A"))
        asked = canned.last("/api/v1/queries")
        assert (asked["vs"], asked["segment.variant"], asked["sort"]) == ("variant:A", "B", "change_ndcg")
        assert "vs=variant%3AA" in page.evaluate("location.hash")

        # A link straight to a query opens its detail.
        tab.after(lambda: page.evaluate("location.hash = '#window=1h&query=' + encodeURIComponent('q/with space')"))
        assert page.is_visible("#query-detail")
        assert page.text_content("#detail-query-id") == "q/with space"
        # One path segment: the slash in the id is escaped.
        assert "/api/v1/queries/" + quote("q/with space", safe="") in [path for path, _, _ in canned.asked]
        classes = page.eval_on_selector_all("#detail-lists .list-card:first-child tbody tr",
                                            "rows => rows.map(r => r.className)")
        assert classes == ["unjudged", "negative", ""]
        assert page.text_content("#detail-lists .list-card:first-child tbody tr.unjudged td.grade") == "unjudged"
        assert page.eval_on_selector_all("#ideal-ordering tbody tr", "rows => rows.map(r => r.dataset.docId)") \
            == ["d-good", "d-neg"]
        assert page.eval_on_selector_all("#judgment-history tbody tr.retracted", "rows => rows.length") == 1
        # Which source each grade is from, and on hover every source's grade of the document.
        assert page.eval_on_selector_all("#detail-lists .list-card:first-child tbody td.source",
                                         "cells => cells.map(c => c.textContent)") == ["", "raters", "coec"]
        assert page.eval_on_selector_all("#ideal-ordering tbody td.source",
                                         "cells => cells.map(c => [c.textContent, c.title])") \
            == [["coec", "raters retracted, coec 3, sdbn 1"], ["raters", "raters -1"]]
        history = page.eval_on_selector_all("#judgment-history tbody td.source", "cs => cs.map(c => c.textContent)")
        assert history == ["raters", "coec", "raters", "raters"]
        # Each document's grade from clicks, its evidence and score, beside the other sources' grades;
        # a document graded by raters alone too.
        clicks = page.eval_on_selector_all("#click-evidence tbody tr", "rows => rows.map(r => [...r.cells].map(c => "
                                           "c.textContent))")
        decided = "2023-11-14 21:13:20 UTC"
        assert clicks == [["d-good", "20", "6", "3.000", "2.000", "3", "raters retracted, sdbn 1", decided],
                          [IMG_ID, "40", "1", "4.000", "0.250", "0", "", decided],
                          ["d-neg", "", "", "", "", "none", "raters -1", ""]]
        assert "COEC" in (page.text_content("#clicks-caption") or "")
    assert tab.errors == []


def test_judging_queue_download_holds_the_rows_served(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/#window=1h&queue_limit=1000") as tab:
        signed_in(tab)
        page = tab.page
        assert page.eval_on_selector_all("#judging-queue tbody tr", "rows => rows.map(r => r.dataset.docId)") \
            == [IMG_ID, "d2"]
        with page.expect_download() as downloading:
            page.click("#download-csv")
        download = downloading.value
        assert download.suggested_filename == "judging-queue.csv"
        path = download.path()
        assert path.read_bytes() == judging_queue_csv(PAIRS).encode()
        path_asked, params, authorization = canned.asked[-1]
        assert (path_asked, params["format"], params["window"], params["limit"]) \
            == ("/api/v1/judging-queue", "csv", "1h", "1000")
        assert authorization == f"Bearer {TOKEN}"
    assert tab.errors == []
    # Every API request after the token was given carried it.
    first_with = next(i for i, (_, _, a) in enumerate(canned.asked) if a)
    assert all(a == f"Bearer {TOKEN}" for _, _, a in canned.asked[first_with:])


def test_a_refusal_is_shown_with_the_api_message(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/#window=1h&view=movers") as tab:
        signed_in(tab)
        page = tab.page
        assert canned.last("/api/v1/queries")["vs"] == "previous"
        assert page.is_visible("#queries-error")
        assert page.text_content("#queries-error") == REFUSED
        assert page.eval_on_selector_all("#worst-queries tbody tr", "rows => rows.length") == 0
        # The other panels still load.
        assert page.eval_on_selector_all("#judging-queue tbody tr", "rows => rows.length") == len(PAIRS)
        tab.after(lambda: page.click("#view-worst"))
        assert page.is_hidden("#queries-error")
        assert "vs" not in canned.last("/api/v1/queries")
    assert tab.errors == []
