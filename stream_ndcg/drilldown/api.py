"""The drill-down HTTP listener: the JSON API under /api/v1/ and the page at /.

    api = Api(explorer, token="")
    port = api.serve("127.0.0.1", 9465)

Routes (all GET; parameters in `question.Question`):

    /api/v1/summary               the window means per segment (the gauges' numbers)
    /api/v1/queries               per query, sortable, with a comparison (vs=previous|<label>:<value>)
    /api/v1/queries/<query_id>    one query's lists, grades, ideal and judgment history
    /api/v1/judging-queue         the unjudged pairs of most exposure (format=json|jsonl|csv)
    /api/v1/experiments           every registered experiment, compared since its start
    /api/v1/experiments/<name>    one of them (`drilldown.experiments`)
    /  /app.js  /app.css          the page: static files, no data in them

Search queries and document ids can be personal data, so: with a token set,
every /api/ route needs ``Authorization: Bearer <token>`` (compared in constant
time); no request line is logged above DEBUG, and even there without its query
string or query id; every answer is ``Cache-Control: no-store`` with a
Content-Security-Policy that lets the page run only its own files. The page
shell carries no data and is served without the token, since a browser cannot
add a header to a navigation; it asks for the token when the API refuses.
"""

from __future__ import annotations

import csv
import hmac
import io
import logging
import time
from http.server import BaseHTTPRequestHandler
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson

from stream_ndcg.drilldown.experiments import EXPERIMENTS, ExperimentReports, experiments_answer
from stream_ndcg.drilldown.explorer import Explorer
from stream_ndcg.drilldown.question import Question
from stream_ndcg.errors import RequestError, StoreUnavailable
from stream_ndcg.listener import Listener, respond

logger = logging.getLogger(__name__)

HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
}
_PAGE_FILES = {"/": ("index.html", "text/html; charset=utf-8"),
               "/app.js": ("app.js", "text/javascript; charset=utf-8"),
               "/app.css": ("app.css", "text/css; charset=utf-8")}
_QUERIES = "/api/v1/queries/"
_CSV_COLUMNS = ("query_id", "doc_id", "exposure", "share", "best_rank", "query_impressions", "query_judged_ratio")
# A spreadsheet runs a cell that starts with one of these as a formula: an id must stay text.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class Api:
    """Serves the explorer's answers over HTTP in a daemon thread."""

    def __init__(self, explorer: Explorer, token: str = "", experiments: ExperimentReports | None = None) -> None:
        self.explorer = explorer
        self.experiments = experiments
        self._token = token.encode()
        self._listener: Listener | None = None

    def authorised(self, header: str | None) -> bool:
        if not self._token:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def answer(self, path: str, params: dict[str, list[str]]) -> tuple[int, bytes, str]:
        """(status, body, content type) of one /api/ request, authorised already."""
        explorer = self.explorer
        try:
            if path == "/api/v1/summary":
                return _json(explorer.summary(Question.parse(params, explorer.view)))
            if path == "/api/v1/queries":
                return _json(explorer.queries(Question.parse(params, explorer.view)))
            if path.startswith(_QUERIES):
                question = Question.parse(params, explorer.view, kind="query")
                return _json(explorer.query(unquote(path.removeprefix(_QUERIES)), question))
            if path == EXPERIMENTS or path.startswith(EXPERIMENTS + "/"):
                return _json(experiments_answer(self.experiments, path))
            if path == "/api/v1/judging-queue":
                question = Question.parse(params, explorer.view, kind="judging-queue")
                return judging_queue_body(explorer.judging_queue(question), question.format)
        except RequestError as exc:
            return exc.status, orjson.dumps({"error": str(exc)}), "application/json"
        except StoreUnavailable as exc:
            logger.warning("drill-down could not read the store: %s", exc)
            return 503, orjson.dumps({"error": "the shared state cannot be read now; retry"}), "application/json"
        return 404, orjson.dumps({"error": "path: no such route"}), "application/json"

    def serve(self, host: str, port: int) -> int:
        """Serve in a daemon thread; return the bound port."""
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                started = time.perf_counter()
                parts = urlsplit(self.path)
                route = parts.path
                if route in _PAGE_FILES:
                    name, content_type = _PAGE_FILES[route]
                    body = page_file(name)
                    status = 200 if body is not None else 404
                    self._send(status, body or b"the page is not installed\n", content_type)
                elif not route.startswith("/api/"):
                    self._send(404, b'{"error": "path: no such route"}', "application/json")
                elif not api.authorised(self.headers.get("Authorization")):
                    self._send(401, b'{"error": "authorization: a bearer token is required"}', "application/json",
                               {"WWW-Authenticate": 'Bearer realm="stream-ndcg"'})
                else:
                    try:
                        params = parse_qs(parts.query, keep_blank_values=True, max_num_fields=64, strict_parsing=False)
                    except ValueError:
                        self._send(400, b'{"error": "query: too many parameters"}', "application/json")
                        return
                    self._send(*api.answer(route, params))
                # The route only: query strings and query ids may hold personal data.
                shown = "/api/v1/queries/<id>" if route.startswith(_QUERIES) else route
                logger.debug("api: GET %s in %.1f ms", shown, (time.perf_counter() - started) * 1000)

            def do_POST(self) -> None:  # noqa: N802
                self._send(405, b'{"error": "method: only GET is served"}', "application/json", {"Allow": "GET"})

            do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

            def _send(self, status: int, body: bytes, content_type: str,
                      extra: dict[str, str] | None = None) -> None:
                respond(self, status, body, content_type, {**HEADERS, **(extra or {})})

            def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
                """Silenced: do_GET logs the route without its query string."""

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                logger.debug("api http: " + format, *args)

        self._listener = Listener(Handler, host, port, "api-http")
        return self._listener.port

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def page_file(name: str) -> bytes | None:
    try:
        return (resources.files("stream_ndcg.drilldown") / "page" / name).read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _json(answer: dict[str, Any]) -> tuple[int, bytes, str]:
    return 200, orjson.dumps(answer), "application/json"


def judging_queue_body(answer: dict[str, Any], form: str) -> tuple[int, bytes, str]:
    """The judging queue as json, jsonl (a pair per line) or csv."""
    if form == "jsonl":
        return 200, b"".join(orjson.dumps(pair) + b"\n" for pair in answer["pairs"]), "application/x-ndjson"
    if form == "csv":
        return 200, judging_queue_csv(answer["pairs"]).encode(), "text/csv; charset=utf-8"
    return _json(answer)


def judging_queue_csv(pairs: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_CSV_COLUMNS)
    for pair in pairs:
        writer.writerow([_cell(pair[column]) for column in _CSV_COLUMNS])
    return out.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return "" if value is None else value

