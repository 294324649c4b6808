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


def comparison(difference: float, standard_error: float, low: float, high: float) -> dict[str, Any]:
    return {"difference": difference, "standard_error": standard_error, "low": low, "high": high,
            "excludes_zero": low > 0 or high < 0}


# Against variant A at k=10, as the API would give them: B's plain interval holds 0 while the
# stratified one (narrower: query difficulty taken out) is below it; C is above A, and shares no
# query with it; the hostile value has a single scored impression, so neither has an error.
AGAINST_A: dict[str, dict[str, Any]] = {"B": {"plain": comparison(-0.0312, 0.0205, -0.1062, 0.0438),
                   "stratified": comparison(-0.0287, 0.0061, -0.0511, -0.0063)},
             "C": {"plain": comparison(0.0514, 0.0118, 0.0082, 0.0946), "stratified": None},
             SCRIPT_ID: {"plain": None, "stratified": None}}


def flipped(compared: dict[str, Any] | None) -> dict[str, Any] | None:
    """A against B from B against A."""
    if compared is None:
        return None
    return comparison(-compared["difference"], compared["standard_error"], -compared["high"], -compared["low"])


def comparisons(control: str) -> dict[str, Any] | None:
    """The summary's `comparisons` with `control` (label:value; empty: none, as without the setting)."""
    if not control:
        return None
    label, _, value = control.partition(":")
    arms: dict[str, Any] = {arm: {"plain": None, "stratified": None} for arm in ("A", *AGAINST_A) if arm != value}
    if value == "A":
        arms = AGAINST_A
    elif value in AGAINST_A:
        arms["A"] = {name: flipped(compared) for name, compared in AGAINST_A[value].items()}
    alpha_each = 0.05 / len(arms)
    return {"control": {"label": label, "value": value},
            "k": {k: {"alpha": 0.05, "alpha_each": alpha_each, "correction": "bonferroni", "n_star": 10_000,
                      "arms": arms} for k in ("5", "10")}}


# How long before each window's answer its figures over queries were computed.
QUERY_FIGURES_AGES = {"1m": 0.4, "5m": 2.4, "1h": 1.0}


def summary(window: str, control: str) -> dict[str, Any]:
    def row(variant: str, ndcg: float, scored: int = 90) -> dict[str, Any]:
        # Under 2 scored impressions (and so under 2 queries) a mean has no standard error.
        errors = {"ndcg_standard_error": 0.0213, "ndcg_clustered_standard_error": 0.0388, "queries": 12} \
            if scored > 1 else {"ndcg_standard_error": None, "ndcg_clustered_standard_error": None, "queries": 1}
        return {"segment": {"variant": variant}, "impressions": 100,
                "k": {k: {"ndcg_mean": ndcg, "dcg_mean": ndcg * 3, "judged_ratio": 0.4, "scored_impressions": scored,
                          "ndcg_query_mean": ndcg - 0.0123, **errors} for k in ("5", "10")}}
    return {"window": window, "windows": ["1m", "5m", "1h"], "cutoffs": [5, 10], "segment_labels": ["variant"],
            "now_ms": NOW, "buckets": [10, 20], "query_figures_age_s": QUERY_FIGURES_AGES[window],
            "rows": [row("A", 0.71), row("B", 0.62), row("C", 0.76), row(SCRIPT_ID, 0.5, scored=1)],
            "comparisons": comparisons(control)}


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
    # The API's `control` setting: the summary's control when a request names none.
    control: str = "variant:A"

    def last(self, path: str) -> dict[str, str]:
        return next(params for asked, params, _ in reversed(self.asked) if asked == path)

    def last_control(self) -> str:
        """The control of the last summary asked for with one (the glance's summaries name none)."""
        return next(params["control"] for asked, params, _ in reversed(self.asked)
                    if asked == "/api/v1/summary" and "control" in params)


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
                answer: Any = summary(params.get("window", "1m"), params.get("control") or record.control)
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


# Per row of the comparisons table: its arm, estimate, texts, and the chart's geometry (viewBox units).
COMPARISON_ROWS = """rows => rows.map(r => {
    const chart = r.querySelector('svg.interval-chart');
    const at = (selector, name) => chart && chart.querySelector(selector)
        ? Number(chart.querySelector(selector).getAttribute(name)) : null;
    const cell = (selector) => r.querySelector(selector) ? r.querySelector(selector).textContent : null;
    return {arm: r.dataset.arm, estimate: r.dataset.estimate, decision: r.dataset.decision,
            decision_text: cell('td.decision'), decision_colour: getComputedStyle(r.querySelector('td.decision')).color,
            difference: cell('td.difference'), standard_error: cell('td.standard-error'), interval: cell('td.interval'),
            missing: cell('td.missing'), label: chart && chart.getAttribute('aria-label'),
            width: chart && Number(chart.getAttribute('viewBox').split(' ')[2]),
            zero: at('line.zero', 'x1'), low: at('rect.interval', 'x'), span: at('rect.interval', 'width'),
            point: at('circle.point', 'cx')};
})"""


def comparison_rows(page: Page) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = page.eval_on_selector_all("#comparisons-table tbody tr[data-arm]", COMPARISON_ROWS)
    return rows


def signed_text(value: float) -> str:
    """As the page writes a difference: a sign (a minus sign, U+2212) and 4 decimals."""
    return ("+" if value > 0 else "\u2212") + f"{abs(value):.4f}"


def test_each_comparison_is_drawn_where_its_numbers_say(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/#window=1h&k=10") as tab:
        signed_in(tab)
        page = tab.page
        # The control setting's: the API's default, shown as chosen.
        assert page.input_value("#control-select") == "variant:A"
        assert canned.last_control() == "variant:A"
        rows = comparison_rows(page)
        assert [(r["arm"], r["estimate"]) for r in rows] == [
            (arm, estimate) for arm in sorted(AGAINST_A) for estimate in ("plain", "stratified")]
        drawn = [(r, AGAINST_A[r["arm"]][r["estimate"]]) for r in rows if r["point"] is not None]
        assert [(r["arm"], r["estimate"]) for r, _ in drawn] == [("B", "plain"), ("B", "stratified"), ("C", "plain")]
        # One linear scale for every bar: 0 at one place, the same units per nDCG for each.
        zero = drawn[0][0]["zero"]
        units = (drawn[0][0]["point"] - zero) / drawn[0][1]["difference"]
        assert units > 0
        for row, numbers in drawn:
            assert row["zero"] == zero
            assert row["point"] == pytest.approx(zero + units * numbers["difference"], abs=1e-6)
            assert row["low"] == pytest.approx(zero + units * numbers["low"], abs=1e-6)
            assert row["low"] + row["span"] == pytest.approx(zero + units * numbers["high"], abs=1e-6)
            assert 0 <= row["low"] <= row["point"] <= row["low"] + row["span"] <= row["width"]
            assert row["difference"] == signed_text(numbers["difference"])
            assert row["standard_error"] == f"{numbers['standard_error']:.4f}"
            assert row["interval"] == f"[{signed_text(numbers['low'])}, {signed_text(numbers['high'])}]"
        # B's plain interval holds 0: not yet decided; its stratified one and C's are beyond it.
        decisions = {(r["arm"], r["estimate"]): (r["decision"], r["decision_text"]) for r, _ in drawn}
        assert decisions == {("B", "plain"): ("undecided", "not yet decided"),
                             ("B", "stratified"): ("below", "B below A"),
                             ("C", "plain"): ("above", "C above A")}
        for row, _ in drawn:
            # Read out as text too: the chart's label carries the numbers and the decision.
            assert row["label"].endswith(": " + row["decision_text"]) and row["difference"] in row["label"]
        assert len({row["decision_colour"] for row, _ in drawn}) == 3
        assert "alpha 0.05, 0.0167 each (Bonferroni)" in text(page, "#comparisons-caption")
        # Another k: the same table for it.
        tab.after(lambda: page.select_option("#k-select", "5"))
        assert text(page, "#comparisons-hint") == "nDCG@5 over the last 1h"
    assert tab.errors == []


def test_missing_comparisons_are_said_in_words(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/#window=1h") as tab:
        signed_in(tab)
        page = tab.page
        # The glance: each mean's errors and query mean, or in words why there is none.
        errors = page.eval_on_selector_all("#summary-table tbody td[data-window='1h'] .errors",
                                           "spans => spans.map(s => s.textContent)")
        means = {row["segment"]["variant"]: row["k"]["10"] for row in summary("1h", "")["rows"]}
        dot = " \u00b7 "
        assert errors == [
            f"no SE (under 2 impressions){dot}no SE by query (under 2 queries){dot}query mean "
            f"{means[SCRIPT_ID]['ndcg_query_mean']:.4f}",
            *(f"SE {means[v]['ndcg_standard_error']:.4f}{dot}by query {means[v]['ndcg_clustered_standard_error']:.4f}"
              f"{dot}query mean {means[v]['ndcg_query_mean']:.4f}" for v in ("A", "B", "C"))]
        # Those by query come from the last computation of the figures over queries: the oldest shown is said.
        assert text(page, "#summary-hint").endswith(
            f"errors by query and query means computed {max(QUERY_FIGURES_AGES.values()):.1f} s ago")
        rows = {(r["arm"], r["estimate"]): r for r in comparison_rows(page)}
        # The hostile value has one scored impression: no variance, so no error and no interval.
        for estimate in ("plain", "stratified"):
            row = rows[(SCRIPT_ID, estimate)]
            assert row["missing"] == "no estimate: too few impressions (under 2 in an arm)"
            assert (row["decision"], row["decision_text"], row["point"]) == ("undecided", "not yet decided", None)
        assert rows[("C", "stratified")]["missing"] == "no estimate: no queries in common yet"
        assert SCRIPT_ID in page.eval_on_selector_all("#comparisons-table tbody th",
                                                      "ths => ths.map(t => t.textContent)")
        shown = text(page, "#comparisons")
        for word in ("NaN", "undefined", "null", "Infinity"):
            assert word not in shown
        assert page.evaluate("typeof window.pwned") == "undefined"
        # A control without impressions in the window: nothing is compared, and the page says so.
        tab.after(lambda: page.evaluate("location.hash = '#window=1h&control=variant%3AZ'"))
        assert canned.last_control() == "variant:Z"
        assert comparison_rows(page) == []
        assert text(page, "#comparisons-table tbody") == "variant = Z has no impressions in the last 1h: nothing to " \
                                                          "compare with"
        assert page.input_value("#control-select") == "variant:Z"
    assert tab.errors == []


def test_the_control_is_chosen_on_the_page(canned: Canned) -> None:
    with open_page(f"http://127.0.0.1:{canned.port}/#window=1h") as tab:
        signed_in(tab)
        page = tab.page
        tab.after(lambda: page.select_option("#control-select", "variant:B"))
        assert canned.last_control() == "variant:B"
        assert "control=variant%3AB" in page.evaluate("location.hash")
        rows = {(r["arm"], r["estimate"]): r for r in comparison_rows(page)}
        # A against B: B's comparisons with A, turned round.
        assert (rows[("A", "plain")]["decision_text"], rows[("A", "stratified")]["decision_text"]) \
            == ("not yet decided", "A above B")
        assert rows[("A", "stratified")]["difference"] == signed_text(-AGAINST_A["B"]["stratified"]["difference"])
        assert rows[("C", "plain")]["missing"] == "no estimate: no standard error yet (sums of squares incomplete)"
        assert page.eval_on_selector("#comparisons", "s => s.dataset.control") == "variant:B"
        # Back to the setting's control: the link needs no parameter for it.
        tab.after(lambda: page.select_option("#control-select", "variant:A"))
        assert "control" not in page.evaluate("location.hash")
        assert canned.last_control() == "variant:A"
    assert tab.errors == []

    # Without a control setting, the page asks for one until a link or the select names it.
    canned.control = ""
    with open_page(f"http://127.0.0.1:{canned.port}/#window=1h") as tab:
        signed_in(tab)
        page = tab.page
        assert page.input_value("#control-select") == ""
        assert text(page, "#comparisons-caption").startswith("no control: choose one")
        assert comparison_rows(page) == []
        tab.after(lambda: page.select_option("#control-select", "variant:A"))
        assert "control=variant%3AA" in page.evaluate("location.hash")
        assert {r["estimate"]: r["decision_text"] for r in comparison_rows(page) if r["arm"] == "B"} \
            == {"plain": "not yet decided", "stratified": "B below A"}
    assert tab.errors == []
