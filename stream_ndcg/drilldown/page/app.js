// The drill-down page: reads /api/v1/ and renders it. Plain script, no framework, no build step, no
// network beyond its own origin (the Content-Security-Policy allows nothing else).
//
// Query ids and document ids are user data: everything is written with textContent and
// createElement, never as markup, so an id of "<script>" is shown as those characters.
// The view's state lives in the URL fragment (#window=1h&segment.variant=B&query=q17), so a link
// (from Grafana, from a chat) opens that view.
"use strict";

(function () {
  const TOKEN_KEY = "stream-ndcg.api-token";
  const PAGE_SIZE = 50;
  // A query's distinct lists shown before "show all": the busiest ones, the API sorts by impressions.
  const LISTS_SHOWN = 8;
  // Defaults are left out of the fragment, so links stay short.
  const DEFAULTS = { view: "worst", sort: "ndcg", order: "asc", offset: "0", min_impressions: "1",
                     queue_limit: "100" };
  const VIEW_SORT = { worst: "ndcg", movers: "change_ndcg", compare: "change_ndcg" };
  // Columns where a higher value is better: their change is coloured.
  const HIGHER_IS_BETTER = new Set(["ndcg", "dcg", "judged_ratio"]);

  let meta = null;  // windows, cutoffs, segment labels and values, the control setting: from the first summary
  let state = {};
  const sequence = { summary: 0, comparisons: 0, queries: 0, detail: 0, queue: 0 };

  // ---- DOM helpers: properties only, never markup -------------------------------------------

  function $(id) { return document.getElementById(id); }

  function el(tag, props, children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null) continue;
      if (name === "dataset") Object.assign(node.dataset, value);
      else if (name === "className") node.className = value;
      else if (name === "text") node.textContent = String(value);
      else node[name] = value;
    }
    for (const child of children || []) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }

  function clear(node) { node.replaceChildren(); return node; }

  function showError(node, message) {
    node.textContent = message || "";
    node.hidden = !message;
  }

  // ---- numbers --------------------------------------------------------------------------------

  const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

  function num(value, digits) {
    if (value === null || value === undefined) return "\u2014";
    return digits === 0 ? integer.format(value) : Number(value).toFixed(digits);
  }

  function signed(value, digits) {
    if (value === null || value === undefined) return "\u2014";
    const text = digits === 0 ? integer.format(Math.abs(value)) : Math.abs(value).toFixed(digits);
    if (Math.abs(value) < 1e-12) return text;
    return (value > 0 ? "+" : "\u2212") + text;
  }

  function changeClass(column, value) {
    if (value === null || value === undefined || Math.abs(value) < 1e-12 || !HIGHER_IS_BETTER.has(column)) {
      return "num";
    }
    return value < 0 ? "num worse" : "num better";
  }

  function plural(count, noun) {
    return num(count, 0) + " " + noun + (count === 1 ? "" : "s");
  }

  function percent(value) {
    return value === null || value === undefined ? "\u2014" : (value * 100).toFixed(2) + " %";
  }

  function time(ms) {
    return new Date(ms).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  function segmentText(segment) {
    const parts = Object.entries(segment || {}).map(([label, value]) => label + "=" + value);
    return parts.length ? parts.join(", ") : "all segments";
  }

  // ---- state in the fragment ------------------------------------------------------------------

  function readState() {
    const params = new URLSearchParams(location.hash.replace(/^#/, ""));
    const next = { segment: {} };
    for (const [name, value] of params) {
      if (name.startsWith("segment.")) {
        if (value !== "") next.segment[name.slice("segment.".length)] = value;
      } else {
        next[name] = value;
      }
    }
    for (const [name, value] of Object.entries(DEFAULTS)) {
      if (next[name] === undefined || next[name] === "") next[name] = value;
    }
    // A link may name only the comparison: vs=previous is the movers, vs=label:value a comparison.
    if (!params.has("view") && next.vs) next.view = next.vs === "previous" ? "movers" : "compare";
    if (next.view === "movers") next.vs = "previous";
    if (next.view === "compare" && (!next.vs || next.vs === "previous")) next.view = "worst";
    if (next.view === "worst") delete next.vs;
    if (!params.has("sort")) next.sort = VIEW_SORT[next.view] || "ndcg";
    if (next.view === "worst" && next.sort.startsWith("change_")) next.sort = "ndcg";
    if (meta) {
      if (!meta.windows.includes(next.window)) next.window = meta.window;
      if (!meta.cutoffs.includes(Number(next.k))) next.k = String(meta.cutoffs[meta.cutoffs.length - 1]);
    }
    return next;
  }

  function fragment(s) {
    const params = new URLSearchParams();
    for (const name of ["window", "k"]) if (s[name]) params.set(name, s[name]);
    for (const [label, value] of Object.entries(s.segment || {})) {
      if (value !== "") params.set("segment." + label, value);
    }
    if (s.view && s.view !== DEFAULTS.view) params.set("view", s.view);
    if (s.view === "compare" && s.vs) params.set("vs", s.vs);
    if (s.sort && s.sort !== (VIEW_SORT[s.view] || DEFAULTS.sort)) params.set("sort", s.sort);
    for (const name of ["order", "offset", "min_impressions", "queue_limit"]) {
      if (s[name] !== undefined && s[name] !== DEFAULTS[name]) params.set(name, s[name]);
    }
    // The control only when it is not the API's default (the `control` setting).
    if (s.control && s.control !== (meta && meta.control)) params.set("control", s.control);
    if (s.query) params.set("query", s.query);
    return "#" + params.toString();
  }

  function navigate(changes) {
    const next = Object.assign({}, state, changes);
    const target = fragment(next);
    if (target === location.hash) {
      loadAll();
    } else {
      location.hash = target;  // hashchange loads it
    }
  }

  // ---- the API --------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  async function api(path, params) {
    const headers = {};
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const query = params && params.toString();
    // Relative: the page works behind a reverse proxy's path prefix too.
    const response = await fetch("api/v1/" + path + (query ? "?" + query : ""), { headers, cache: "no-store" });
    if (response.status === 401) {
      showTokenForm(Boolean(token));
      throw new ApiError(401, "authorization: the API needs a token");
    }
    if (!response.ok) {
      let message = "HTTP " + response.status;
      try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
      throw new ApiError(response.status, message);
    }
    return response;
  }

  function filterParams(extra) {
    const params = new URLSearchParams();
    params.set("window", state.window);
    for (const [label, value] of Object.entries(state.segment)) params.set("segment." + label, value);
    for (const [name, value] of Object.entries(extra || {})) {
      if (value !== undefined && value !== null && value !== "") params.set(name, value);
    }
    return params;
  }

  function showTokenForm(rejected) {
    const form = $("token-form");
    form.hidden = false;
    form.classList.toggle("rejected", rejected);
    $("token-input").focus();
  }

  // ---- controls -------------------------------------------------------------------------------

  function option(value, text, selected) {
    return el("option", { value, text, selected });
  }

  function renderControls() {
    const windows = clear($("window-select"));
    for (const w of meta.windows) windows.append(option(w, w, w === state.window));
    const ks = clear($("k-select"));
    for (const k of meta.cutoffs) ks.append(option(String(k), String(k), String(k) === String(state.k)));

    const filters = clear($("segment-filters"));
    for (const label of meta.segment_labels) {
      const values = new Set(meta.values[label] || []);
      if (state.segment[label] !== undefined) values.add(state.segment[label]);
      const select = el("select", { dataset: { label } }, [option("", "all", state.segment[label] === undefined)]);
      select.id = "segment-" + label;
      for (const value of [...values].sort()) select.append(option(value, value, state.segment[label] === value));
      select.addEventListener("change", () => {
        const segment = Object.assign({}, state.segment);
        if (select.value === "") delete segment[label]; else segment[label] = select.value;
        navigate({ segment, offset: "0" });
      });
      filters.append(el("label", {}, [label + " ", select]));
    }
    $("min-impressions").value = state.min_impressions;
    $("queue-limit").value = state.queue_limit;

    const compare = clear($("compare-select"));
    compare.append(option("", "\u2014", state.view !== "compare"));
    for (const label of meta.segment_labels) {
      for (const value of [...(meta.values[label] || [])].sort()) {
        if (state.segment[label] === value) continue;
        const vs = label + ":" + value;
        compare.append(option(vs, label + " = " + value, state.view === "compare" && state.vs === vs));
      }
    }
    if (state.view === "compare" && ![...compare.options].some((o) => o.value === state.vs)) {
      compare.append(option(state.vs, state.vs.replace(":", " = "), true));
    }
    compare.disabled = meta.segment_labels.length === 0;
    for (const button of document.querySelectorAll("#queries [data-view]")) {
      button.classList.toggle("active", button.dataset.view === state.view);
      button.setAttribute("aria-selected", String(button.dataset.view === state.view));
    }
    compare.parentElement.classList.toggle("active", state.view === "compare");

    const controls = clear($("control-select"));
    const chosen = controlOf(state);
    if (!chosen) controls.append(option("", "\u2014", true));
    for (const label of meta.segment_labels) {
      for (const value of [...(meta.values[label] || [])].sort()) {
        const control = label + ":" + value;
        controls.append(option(control, label + " = " + value, control === chosen));
      }
    }
    if (chosen && ![...controls.options].some((o) => o.value === chosen)) {
      controls.append(option(chosen, chosen.replace(":", " = "), true));
    }
    controls.disabled = meta.segment_labels.length === 0;
  }

  function bindControls() {
    $("controls").addEventListener("submit", (event) => event.preventDefault());
    $("window-select").addEventListener("change", (e) => navigate({ window: e.target.value, offset: "0" }));
    $("k-select").addEventListener("change", (e) => navigate({ k: e.target.value, offset: "0" }));
    $("min-impressions").addEventListener("change", (e) => {
      const value = String(Math.max(0, parseInt(e.target.value, 10) || 0));
      navigate({ min_impressions: value, offset: "0" });
    });
    $("refresh").addEventListener("click", () => start());
    for (const button of document.querySelectorAll("#queries [data-view]")) {
      button.addEventListener("click", () => {
        const view = button.dataset.view;
        navigate({ view, vs: view === "movers" ? "previous" : undefined, sort: VIEW_SORT[view], order: "asc",
                   offset: "0" });
      });
    }
    $("compare-select").addEventListener("change", (e) => {
      const vs = e.target.value;
      navigate(vs ? { view: "compare", vs, sort: "change_ndcg", order: "asc", offset: "0" }
                  : { view: "worst", vs: undefined, sort: "ndcg", order: "asc", offset: "0" });
    });
    $("control-select").addEventListener("change", (e) => navigate({ control: e.target.value || undefined }));
    $("page-prev").addEventListener("click", () => {
      navigate({ offset: String(Math.max(0, Number(state.offset) - PAGE_SIZE)) });
    });
    $("page-next").addEventListener("click", () => navigate({ offset: String(Number(state.offset) + PAGE_SIZE) }));
    $("detail-close").addEventListener("click", () => navigate({ query: undefined }));
    $("detail-more-lists").addEventListener("click", () => {
      $("detail-more-lists").hidden = true;
      $("detail-lists").classList.add("all");
    });
    $("queue-limit").addEventListener("change", (e) => navigate({ queue_limit: e.target.value }));
    $("download-csv").addEventListener("click", downloadQueue);
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token-input").value);
      $("token-input").value = "";
      $("token-form").hidden = true;
      start();
    });
    window.addEventListener("hashchange", () => { state = readState(); loadAll(); });
  }

  function queryLink(queryId) {
    const link = el("a", { href: fragment(Object.assign({}, state, { query: queryId })), text: queryId,
                           className: "query-id" });
    link.addEventListener("click", (event) => {
      if (event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      navigate({ query: queryId });
    });
    return link;
  }

  // ---- at a glance: windows x segments --------------------------------------------------------

  async function loadSummary() {
    const mine = ++sequence.summary;
    const k = String(state.k);
    let answers;
    try {
      answers = await Promise.all(meta.windows.map(async (w) => {
        const params = new URLSearchParams({ window: w });
        return (await api("summary", params)).json();
      }));
    } catch (error) {
      if (mine === sequence.summary) showError($("error"), error.message);
      return;
    }
    if (mine !== sequence.summary) return;
    const rows = new Map();  // segment key -> {segment, by window}
    for (const answer of answers) {
      for (const row of answer.rows) {
        const key = JSON.stringify(meta.segment_labels.map((label) => row.segment[label]));
        if (!rows.has(key)) rows.set(key, { segment: row.segment, windows: {} });
        rows.get(key).windows[answer.window] = row;
      }
    }
    const head = clear(document.querySelector("#summary-table thead"));
    head.append(el("tr", {}, [
      ...meta.segment_labels.map((label) => el("th", { text: label })),
      ...meta.windows.map((w) => el("th", { text: w, className: w === state.window ? "num current" : "num" })),
    ]));
    const body = clear(document.querySelector("#summary-table tbody"));
    for (const [key, row] of [...rows.entries()].sort()) {
      const selected = meta.segment_labels.every((label) => state.segment[label] === undefined
                                                          || state.segment[label] === row.segment[label]);
      const tr = el("tr", { className: selected ? "selected" : "", dataset: { segment: key } },
                    meta.segment_labels.map((label) => el("th", { text: row.segment[label] })));
      for (const w of meta.windows) {
        const figures = row.windows[w] && row.windows[w].k[k];
        const cell = el("td", { className: w === state.window ? "cell current" : "cell", dataset: { window: w } });
        if (figures) {
          const meter = el("meter", { min: 0, max: 1, low: 0.5, high: 0.8, optimum: 1,
                                      value: figures.ndcg_mean === null ? 0 : figures.ndcg_mean });
          cell.append(el("span", { className: "big", text: num(figures.ndcg_mean, 4) }), meter,
                      el("span", { className: "small",
                                   text: "judged " + num(figures.judged_ratio, 3) + " \u00b7 "
                                         + num(row.windows[w].impressions, 0) + " imp" }),
                      el("span", { className: "small errors", text: errorsText(figures),
                                   title: "standard error of the mean; by query: the query-clustered one, for "
                                          + "comparing with an earlier window; query mean: each query once" }));
        } else {
          cell.append(el("span", { className: "small", text: "\u2014" }));
        }
        cell.title = "open " + segmentText(row.segment) + " over " + w;
        cell.addEventListener("click", () => {
          navigate({ window: w, segment: Object.assign({}, row.segment), offset: "0" });
        });
        tr.append(cell);
      }
      body.append(tr);
    }
    if (rows.size === 0) {
      body.append(el("tr", {}, [el("td", { colSpan: meta.segment_labels.length + meta.windows.length,
                                           className: "empty", text: "no impressions in any window yet" })]));
    }
    // The errors by query and the query means come from a computation brought up to date every
    // query_figures_interval, not from this answer's moment: say how old the oldest shown is.
    const ages = answers.map((answer) => answer.query_figures_age_s).filter(finite);
    $("summary-hint").textContent = "mean nDCG@" + k + " per window and segment; click a cell to open it"
      + (ages.length ? "; errors by query and query means computed " + num(Math.max(...ages), 1) + " s ago" : "");
  }

  // A mean's standard errors (impression-level, and query-clustered: for comparing a window with
  // an earlier one) and the query-averaged mean, each said in words where the API has none.
  function errorsText(figures) {
    const plain = figures.ndcg_standard_error;
    const clustered = figures.ndcg_clustered_standard_error;
    const queryMean = figures.ndcg_query_mean;
    const few = (count) => !finite(count) || count < 2;
    return (finite(plain) ? "SE " + num(plain, 4)
      : few(figures.scored_impressions) ? "no SE (under 2 impressions)" : "no SE yet (sums of squares incomplete)")
      + " \u00b7 " + (finite(clustered) ? "by query " + num(clustered, 4)
      : few(figures.queries) ? "no SE by query (under 2 queries)" : "no SE by query")
      + (finite(queryMean) ? " \u00b7 query mean " + num(queryMean, 4) : "");
  }

  // ---- against the control: each difference with its always-valid interval -------------------

  const SVG = "http://www.w3.org/2000/svg";
  // The chart's drawing box in viewBox units, which app.css draws 1:1 in pixels: the interval bar, its point and 0.
  const CHART = { width: 240, height: 24, pad: 10 };
  const ESTIMATES = [["plain", "plain"], ["stratified", "stratified by query"]];

  function svg(tag, attributes, children) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attributes || {})) node.setAttribute(name, String(value));
    for (const child of children || []) node.append(child);
    return node;
  }

  // The effective control, "label:value": the page's choice, else the API's default (the setting).
  function controlOf(s) {
    return s.control || (meta && meta.control) || "";
  }

  function finite(value) {
    return typeof value === "number" && Number.isFinite(value);
  }

  // One scale for every bar of the table, from the lowest bound to the highest with 0 always in
  // it, so bars compare by length and by where they lie from 0.
  function chartScale(comparisons) {
    let low = 0;
    let high = 0;
    for (const c of comparisons) {
      for (const value of [c.low, c.high, c.difference]) {
        if (finite(value)) { low = Math.min(low, value); high = Math.max(high, value); }
      }
    }
    const margin = high > low ? (high - low) * 0.06 : 0.01;
    low -= margin;
    high += margin;
    const inner = CHART.width - 2 * CHART.pad;
    return { low, high, x: (value) => CHART.pad + (value - low) / (high - low) * inner };
  }

  // Where the interval is: decided once it excludes 0, and then on which side of the control.
  function decision(comparison, arm, control) {
    if (!comparison || !comparison.excludes_zero) {
      return { key: "undecided", text: "not yet decided" };
    }
    return comparison.high < 0 ? { key: "below", text: arm + " below " + control }
      : { key: "above", text: arm + " above " + control };
  }

  function intervalChart(comparison, scale, verdict, description) {
    const x0 = scale.x(0);
    const mid = CHART.height / 2;
    const parts = [svg("title", {}, [document.createTextNode(description)]),
                   svg("line", { class: "zero", x1: x0, x2: x0, y1: 1, y2: CHART.height - 1 })];
    if (finite(comparison.low) && finite(comparison.high)) {
      const low = scale.x(comparison.low);
      parts.push(svg("rect", { class: "interval", x: low, y: mid - 4, width: scale.x(comparison.high) - low,
                               height: 8, rx: 2 }));
    }
    parts.push(svg("circle", { class: "point", cx: scale.x(comparison.difference), cy: mid, r: 3.5 }));
    return svg("svg", { class: "interval-chart " + verdict.key, role: "img", "aria-label": description,
                        viewBox: "0 0 " + CHART.width + " " + CHART.height }, parts);
  }

  // The scale's ends and 0, an end left out where its label would run into 0's.
  function axisChart(scale) {
    const x0 = scale.x(0);
    const ticks = [[x0, "0", "middle"]];
    if (x0 > 40) ticks.push([0, signed(scale.low, 3), "start"]);
    if (x0 < CHART.width - 40) ticks.push([CHART.width, signed(scale.high, 3), "end"]);
    return svg("svg", { class: "interval-axis", viewBox: "0 0 " + CHART.width + " 14", "aria-hidden": "true" },
               ticks.map(([x, label, anchor]) => svg("text", { x, y: 11, "text-anchor": anchor },
                                                     [document.createTextNode(label)])));
  }

  // Why the API gave no estimate: an arm under 2 scored impressions has no variance; otherwise
  // the stratified one lacks a query both arms saw (or a query seen twice), and the plain one
  // sums of squares that hold every impression (after an upgrade, until they do).
  function missingReason(method, scored) {
    if (scored.some((n) => !finite(n) || n < 2)) return "too few impressions (under 2 in an arm)";
    return method === "stratified" ? "no queries in common yet" : "no standard error yet (sums of squares incomplete)";
  }

  async function loadComparisons() {
    const mine = ++sequence.comparisons;
    const control = controlOf(state);
    const params = new URLSearchParams({ window: state.window });
    if (control) params.set("control", control);
    let answer;
    try {
      answer = await (await api("summary", params)).json();
    } catch (error) {
      if (mine !== sequence.comparisons) return;
      showError($("comparisons-error"), error.message);
      clear(document.querySelector("#comparisons-table thead"));
      clear(document.querySelector("#comparisons-table tbody"));
      return;
    }
    if (mine !== sequence.comparisons) return;
    showError($("comparisons-error"), "");
    renderComparisons(answer);
  }

  function renderComparisons(answer) {
    const k = String(state.k);
    const head = clear(document.querySelector("#comparisons-table thead"));
    const body = clear(document.querySelector("#comparisons-table tbody"));
    const section = $("comparisons");
    const found = answer.comparisons;
    $("comparisons-hint").textContent = "nDCG@" + k + " over the last " + answer.window;
    if (!found) {
      delete section.dataset.control;
      $("comparisons-caption").textContent = "no control: choose one, a value of a segment label, to compare the "
        + "label's other values with it (or set control)";
      return;
    }
    const label = found.control.label;
    const control = found.control.value;
    section.dataset.control = label + ":" + control;
    const atK = found.k[k] || { arms: {}, alpha: null, alpha_each: null, n_star: null };
    const arms = Object.keys(atK.arms).sort();
    const scored = {};  // value -> scored impressions at k, summed over the other labels
    for (const row of answer.rows) {
      const value = row.segment[label];
      const figures = row.k[k];
      scored[value] = (scored[value] || 0) + (figures ? figures.scored_impressions : 0);
    }
    $("comparisons-caption").textContent = "each value of " + label + " less " + label + " = " + control
      + " (the control), with its standard error and always-valid interval (alpha " + atK.alpha
      + (arms.length > 1 ? ", " + num(atK.alpha_each, 4) + " each (Bonferroni)" : "") + ", N* "
      + num(atK.n_star, 0) + "); decided when the interval excludes 0. Over a sliding window: the "
      + "evidence of the last " + answer.window + ", not a decision anchored at an experiment's start.";
    const comparisons = arms.flatMap((arm) => ESTIMATES.map(([method]) => atK.arms[arm][method]))
      .filter((c) => c);
    const scale = chartScale(comparisons);
    head.append(el("tr", {}, [
      el("th", { text: label }), el("th", { text: "estimate" }),
      el("th", { className: "num", text: "difference" }), el("th", { className: "num", text: "standard error" }),
      el("th", { className: "num", text: "always-valid interval" }),
      el("th", { className: "chart" }, [axisChart(scale)]), el("th", { text: "decision" }),
    ]));
    if (!(control in scored)) {
      body.append(el("tr", {}, [el("td", { colSpan: 7, className: "empty",
                                           text: label + " = " + control + " has no impressions in the last "
                                                 + answer.window + ": nothing to compare with" })]));
      return;
    }
    if (arms.length === 0) {
      body.append(el("tr", {}, [el("td", { colSpan: 7, className: "empty",
                                           text: "no other value of " + label + " in the last " + answer.window })]));
      return;
    }
    for (const arm of arms) {
      ESTIMATES.forEach(([method, title], index) => {
        const comparison = atK.arms[arm][method];
        const verdict = decision(comparison, arm, control);
        const tr = el("tr", { className: state.segment[label] === arm ? "selected" : "",
                              dataset: { arm, estimate: method, decision: verdict.key } });
        if (index === 0) tr.append(el("th", { rowSpan: ESTIMATES.length, text: arm }));
        tr.append(el("td", { text: title }));
        if (!comparison) {
          tr.append(el("td", { colSpan: 4, className: "missing", text: "no estimate: "
                                                                        + missingReason(method, [scored[arm], scored[control]]) }));
        } else {
          const interval = finite(comparison.low) && finite(comparison.high)
            ? "[" + signed(comparison.low, 4) + ", " + signed(comparison.high, 4) + "]" : "no interval";
          const description = arm + " \\u2212 " + control + " " + signed(comparison.difference, 4) + ", interval "
            + interval + ": " + verdict.text;
          tr.append(el("td", { className: "num difference", text: signed(comparison.difference, 4) }),
                    el("td", { className: "num standard-error",
                               text: finite(comparison.standard_error) ? num(comparison.standard_error, 4)
                                 : "no standard error" }),
                    el("td", { className: "num interval", text: interval }),
                    el("td", { className: "chart" }, [intervalChart(comparison, scale, verdict, description)]));
        }
        tr.append(el("td", { className: "decision " + verdict.key, text: verdict.text }));
        body.append(tr);
      });
    }
  }

  // ---- worst queries, movers, comparison ------------------------------------------------------

  function queryColumns(withChange) {
    const k = state.k;
    if (!withChange) {
      return [
        { sort: "query_id", title: "query" },
        { sort: "impressions", title: "impressions", value: (r) => num(r.impressions, 0) },
        { sort: "scored_impressions", title: "scored", value: (r) => num(r.scored_impressions, 0) },
        { sort: "ndcg", title: "nDCG@" + k, value: (r) => num(r.ndcg, 4) },
        { sort: "dcg", title: "DCG@" + k, value: (r) => num(r.dcg, 3) },
        { sort: "judged_ratio", title: "judged", value: (r) => num(r.judged_ratio, 3) },
      ];
    }
    const vs = (r) => r.vs || {};
    const change = (r) => r.change || {};
    return [
      { sort: "query_id", title: "query" },
      { sort: "impressions", title: "impressions", value: (r) => num(r.impressions, 0) },
      { sort: "change_impressions", title: "\u0394 imp", value: (r) => signed(change(r).impressions, 0),
        column: "impressions", change: true },
      { sort: "ndcg", title: "nDCG@" + k, value: (r) => num(r.ndcg, 4) },
      { title: "vs nDCG", value: (r) => num(vs(r).ndcg, 4) },
      { sort: "change_ndcg", title: "\u0394 nDCG", value: (r) => signed(change(r).ndcg, 4), column: "ndcg",
        change: true },
      { sort: "dcg", title: "DCG@" + k, value: (r) => num(r.dcg, 3) },
      { sort: "change_dcg", title: "\u0394 DCG", value: (r) => signed(change(r).dcg, 3), column: "dcg",
        change: true },
      { sort: "judged_ratio", title: "judged", value: (r) => num(r.judged_ratio, 3) },
      { sort: "change_judged_ratio", title: "\u0394 judged", value: (r) => signed(change(r).judged_ratio, 3),
        column: "judged_ratio", change: true },
    ];
  }

  async function loadQueries() {
    const mine = ++sequence.queries;
    const params = filterParams({ k: state.k, sort: state.sort, order: state.order, limit: PAGE_SIZE,
                                  offset: state.offset, min_impressions: state.min_impressions,
                                  vs: state.view === "worst" ? "" : state.vs });
    const titles = { worst: "Worst queries", movers: "Biggest movers",
                     compare: "Compared with " + String(state.vs || "").replace(":", " = ") };
    $("queries-title").textContent = titles[state.view];
    $("queries").dataset.view = state.view;
    let answer;
    try {
      answer = await (await api("queries", params)).json();
    } catch (error) {
      if (mine !== sequence.queries) return;
      showError($("queries-error"), error.message);
      clear(document.querySelector("#worst-queries tbody"));
      $("queries-caption").textContent = "";
      return;
    }
    if (mine !== sequence.queries) return;
    showError($("queries-error"), "");
    renderQueries(answer);
  }

  function renderQueries(answer) {
    const columns = queryColumns(Boolean(answer.vs));
    const head = clear(document.querySelector("#worst-queries thead"));
    const headRow = el("tr");
    for (const column of columns) {
      const th = el("th", { text: column.title, className: column.sort === "query_id" || !column.value ? "" : "num" });
      if (column.sort) {
        th.dataset.sort = column.sort;
        th.classList.add("sortable");
        th.tabIndex = 0;
        if (column.sort === answer.sort) {
          th.classList.add(answer.order === "desc" ? "sorted-desc" : "sorted-asc");
          th.setAttribute("aria-sort", answer.order === "desc" ? "descending" : "ascending");
        }
        const resort = () => {
          const order = column.sort === state.sort ? (state.order === "asc" ? "desc" : "asc")
            : (column.sort === "impressions" || column.sort === "scored_impressions" ? "desc" : "asc");
          navigate({ sort: column.sort, order, offset: "0" });
        };
        th.addEventListener("click", resort);
        th.addEventListener("keydown", (event) => { if (event.key === "Enter") resort(); });
      }
      headRow.append(th);
    }
    head.append(headRow);

    const body = clear(document.querySelector("#worst-queries tbody"));
    for (const row of answer.queries) {
      const tr = el("tr", { dataset: { queryId: row.query_id },
                            className: row.query_id === state.query ? "selected" : "" });
      for (const column of columns) {
        if (!column.value) {
          tr.append(el("td", { className: "id" }, [queryLink(row.query_id)]));
          continue;
        }
        const value = column.change ? (row.change || {})[column.column] : null;
        tr.append(el("td", { className: column.change ? changeClass(column.column, value) : "num",
                             text: column.value(row) }));
      }
      tr.addEventListener("click", (event) => {
        if (event.target.closest("a")) return;
        navigate({ query: row.query_id });
      });
      body.append(tr);
    }
    if (answer.queries.length === 0) {
      body.append(el("tr", {}, [el("td", { colSpan: columns.length, className: "empty",
                                           text: "no query with at least " + state.min_impressions
                                                 + " impressions here" })]));
    }
    const against = answer.vs === "previous" ? " against the " + answer.window + " before"
      : answer.vs ? " against " + answer.vs.replace(":", " = ") : "";
    $("queries-caption").textContent = num(answer.total, 0) + " queries in the last " + answer.window + " ("
      + segmentText(answer.segment) + "), nDCG@" + answer.k + against + ", as of " + time(answer.now_ms);
    const first = answer.total === 0 ? 0 : answer.offset + 1;
    const last = Math.min(answer.total, answer.offset + answer.queries.length);
    $("page-info").textContent = first + "\u2013" + last + " of " + num(answer.total, 0);
    $("page-prev").disabled = answer.offset === 0;
    $("page-next").disabled = answer.offset + answer.limit >= answer.total;
  }

  // ---- one query ------------------------------------------------------------------------------

  async function loadDetail() {
    const mine = ++sequence.detail;
    const section = $("query-detail");
    if (!state.query) {
      section.hidden = true;
      delete section.dataset.queryId;
      return;
    }
    section.hidden = false;
    section.dataset.queryId = state.query;
    $("detail-query-id").textContent = state.query;
    let answer;
    try {
      answer = await (await api("queries/" + encodeURIComponent(state.query), filterParams())).json();
    } catch (error) {
      if (mine !== sequence.detail) return;
      showError($("detail-error"), error.message);
      for (const id of ["detail-summary", "detail-lists"]) clear($(id));
      for (const id of ["ideal-ordering", "judgment-history", "click-evidence"]) {
        clear(document.querySelector("#" + id + " tbody"));
      }
      return;
    }
    if (mine !== sequence.detail) return;
    showError($("detail-error"), "");
    renderDetail(answer);
  }

  function gradeCell(grade) {
    if (grade === null || grade === undefined) return el("td", { className: "num grade", text: "unjudged" });
    return el("td", { className: "num grade", text: gradeText(grade) });
  }

  function gradeText(grade) {
    return String(Number(grade.toFixed(2)));
  }

  // Which judgment source a grade is from; the other sources' grades of the document on hover.
  function sourceCell(source, sourceGrades) {
    const others = Object.entries(sourceGrades || {})
      .map(([name, grade]) => name + " " + (grade === null ? "retracted" : gradeText(grade))).join(", ");
    return el("td", { className: "source", text: source || "", title: others });
  }

  function gradeClass(grade) {
    if (grade === null || grade === undefined) return "unjudged";
    return grade < 0 ? "negative" : "";
  }

  function renderDetail(answer) {
    const cutoffs = answer.cutoffs.map(String);
    const maxK = Math.max(...answer.cutoffs);
    $("detail-caption").textContent = "last " + answer.window + " (" + segmentText(state.segment) + "), ideal "
      + answer.ideal + ", gain " + answer.gain + ", as of " + time(answer.now_ms) + "; "
      + answer.lists_total + " distinct ranked list" + (answer.lists_total === 1 ? "" : "s")
      + (answer.lists_total > answer.lists.length ? " (the " + answer.lists.length + " busiest below)" : "");

    const figures = el("table", { className: "grid compact", id: "detail-figures" }, [
      el("thead", {}, [el("tr", {}, [el("th", { text: "k" }), el("th", { className: "num", text: "nDCG" }),
                                       el("th", { className: "num", text: "DCG" }),
                                       el("th", { className: "num", text: "judged" }),
                                       el("th", { className: "num", text: "scored" })])]),
      el("tbody", {}, cutoffs.map((k) => {
        const f = answer.summary.k[k] || {};
        return el("tr", { className: k === String(state.k) ? "selected" : "" }, [
          el("th", { text: "@" + k }), el("td", { className: "num", text: num(f.ndcg, 4) }),
          el("td", { className: "num", text: num(f.dcg, 3) }),
          el("td", { className: "num", text: num(f.judged_ratio, 3) }),
          el("td", { className: "num", text: num(f.scored_impressions, 0) })]);
      })),
    ]);
    clear($("detail-summary")).append(
      el("div", { className: "figure" }, [el("span", { className: "big", text: num(answer.summary.impressions, 0) }),
                                          el("span", { className: "small", text: "impressions" })]),
      figures);

    const lists = clear($("detail-lists"));
    const more = $("detail-more-lists");
    more.hidden = answer.lists.length <= LISTS_SHOWN;
    more.textContent = "show all " + answer.lists.length + " lists";
    lists.classList.remove("all");
    answer.lists.forEach((list, index) => {
      const perK = cutoffs.map((k) => "nDCG@" + k + " " + num(list.ndcg[k], 4) + " (DCG " + num(list.dcg[k], 3)
                                      + " of " + num(list.ideal_dcg[k], 3) + ")").join(" \u00b7 ");
      const segments = list.segments.map((s) => segmentText(s.segment) + " (" + num(s.impressions, 0) + ")").join("; ");
      const rows = list.results.map((result) => el("tr", {
        className: [gradeClass(result.grade), result.rank > maxK ? "beyond-k" : ""].join(" ").trim(),
        dataset: { docId: result.doc_id, rank: String(result.rank) },
      }, [el("td", { className: "num", text: String(result.rank) }), el("td", { className: "id", text: result.doc_id }),
          gradeCell(result.grade), sourceCell(result.source)]));
      lists.append(el("div", { className: index < LISTS_SHOWN ? "list-card" : "list-card extra",
                               dataset: { listIndex: String(index) } }, [
        el("div", { className: "list-head" }, [
          el("strong", { text: "list " + (index + 1) }),
          el("span", { text: " \u00b7 " + plural(list.impressions, "impression") + " \u00b7 " + segments }),
        ]),
        el("div", { className: "small", text: perK }),
        el("table", { className: "grid compact list" }, [
          el("thead", {}, [el("tr", {}, [el("th", { className: "num", text: "rank" }), el("th", { text: "doc" }),
                                           el("th", { className: "num", text: "grade" }),
                                           el("th", { text: "source" })])]),
          el("tbody", {}, rows),
        ]),
      ]));
    });

    $("ideal-caption").textContent = "ideal DCG " + cutoffs.map((k) => "@" + k + " " + num(answer.ideal_dcg[k], 3))
      .join(", ") + (answer.ideal === "list" ? " (with ideal=list each list's own ideal DCG counts)" : "");
    const idealHead = clear(document.querySelector("#ideal-ordering thead"));
    idealHead.append(el("tr", {}, [el("th", { className: "num", text: "rank" }), el("th", { text: "doc" }),
                                    el("th", { className: "num", text: "grade" }), el("th", { text: "source" })]));
    const idealBody = clear(document.querySelector("#ideal-ordering tbody"));
    answer.ideal_ordering.forEach((entry, index) => {
      idealBody.append(el("tr", { className: gradeClass(entry.grade), dataset: { docId: entry.doc_id } }, [
        el("td", { className: "num", text: String(index + 1) }), el("td", { className: "id", text: entry.doc_id }),
        gradeCell(entry.grade), sourceCell(entry.source, entry.source_grades)]));
    });

    const historyHead = clear(document.querySelector("#judgment-history thead"));
    historyHead.append(el("tr", {}, [el("th", { text: "doc" }), el("th", { text: "time" }),
                                      el("th", { text: "event" }), el("th", { className: "num", text: "grade" }),
                                      el("th", { text: "source" })]));
    const historyBody = clear(document.querySelector("#judgment-history tbody"));
    for (const [docId, entries] of Object.entries(answer.judgments)) {
      entries.forEach((entry, index) => {
        const retracted = entry.grade === null;
        historyBody.append(el("tr", {
          className: [retracted ? "retracted" : gradeClass(entry.grade), index === 0 ? "first" : ""].join(" ").trim(),
          dataset: { docId },
        }, [el("td", { className: "id", text: index === 0 ? docId : "" }), el("td", { text: time(entry.ts) }),
            el("td", { className: "id", text: entry.event_id }),
            el("td", { className: "num grade", text: retracted ? "retracted" : gradeText(entry.grade) }),
            sourceCell(entry.source)]));
      });
    }
    if (Object.keys(answer.judgments).length === 0) {
      historyBody.append(el("tr", {}, [el("td", { colSpan: 5, className: "empty", text: "no judgments" })]));
    }
    renderClicks(answer);
  }

  // The evidence each model publishes, as columns: COEC's expected clicks, SDBN's cascade counts.
  const EVIDENCE_COLUMNS = {
    coec: [["impressions", "impressions", 0], ["clicks", "clicks", 0], ["expected_clicks", "expected clicks", 3]],
    sdbn: [["impressions", "impressions", 0], ["examinations", "examinations", 0], ["clicks", "clicks", 0],
           ["last_clicks", "last clicks", 0]],
  };
  const SCORE_RULE = {
    coec: "score = clicks / expected clicks",
    sdbn: "score = (clicks + 1) / (examinations + 2) \u00d7 (last clicks + 1) / (clicks + 2)",
  };

  // Per document: its grade from clicks with the evidence and score behind it, beside the grades of
  // the other sources (a rater's); documents graded by other sources only show those.
  function renderClicks(answer) {
    const clicks = answer.clicks;
    const head = clear(document.querySelector("#click-evidence thead"));
    const body = clear(document.querySelector("#click-evidence tbody"));
    if (!clicks.available) {
      $("clicks-caption").textContent = "not available: " + clicks.reason;
      return;
    }
    const model = clicks.model || "coec";
    const columns = EVIDENCE_COLUMNS[model] || [];
    $("clicks-caption").textContent = clicks.model
      ? model.toUpperCase() + ", as the judge last published each grade: " + SCORE_RULE[model]
        + "; a pair with fewer impressions than click_min_impressions has no grade"
      : "no document of this query holds a grade from clicks (fewer impressions than click_min_impressions)";
    head.append(el("tr", {}, [el("th", { text: "doc" }),
                              ...columns.map(([, title]) => el("th", { className: "num", text: title })),
                              el("th", { className: "num", text: "score" }),
                              el("th", { className: "num", text: "click grade" }),
                              el("th", { text: "other grades" }), el("th", { text: "decided" })]));
    const others = {};
    for (const entry of answer.ideal_ordering) {
      others[entry.doc_id] = Object.fromEntries(Object.entries(entry.source_grades || {})
        .filter(([source]) => source !== clicks.model));
    }
    const docs = Object.keys(clicks.documents).sort((a, b) =>
      clicks.documents[b].score - clicks.documents[a].score || (a < b ? -1 : a > b ? 1 : 0));
    for (const docId of Object.keys(others).sort()) {
      if (!(docId in clicks.documents) && Object.keys(others[docId]).length) docs.push(docId);
    }
    for (const docId of docs) {
      const entry = clicks.documents[docId];
      const otherGrades = Object.entries(entry ? entry.other_grades : others[docId])
        .map(([source, grade]) => source + " " + (grade === null ? "retracted" : gradeText(grade))).join(", ");
      body.append(el("tr", { className: entry ? gradeClass(entry.grade) : "unjudged", dataset: { docId } }, [
        el("td", { className: "id", text: docId }),
        ...columns.map(([name, , digits]) => el("td", { className: "num",
                                                     text: entry ? num(entry.evidence[name], digits) : "" })),
        el("td", { className: "num", text: entry ? num(entry.score, 3) : "" }),
        entry ? gradeCell(entry.grade) : el("td", { className: "num grade", text: "none" }),
        el("td", { className: "source", text: otherGrades }),
        el("td", { text: entry ? time(entry.ts) : "" })]));
    }
    if (docs.length === 0) {
      body.append(el("tr", {}, [el("td", { colSpan: columns.length + 5, className: "empty", text: "no grades" })]));
    }
  }

  // ---- judging queue --------------------------------------------------------------------------

  function queueParams(format) {
    return filterParams({ k: state.k, limit: state.queue_limit, format });
  }

  async function loadQueue() {
    const mine = ++sequence.queue;
    let answer;
    try {
      answer = await (await api("judging-queue", queueParams("json"))).json();
    } catch (error) {
      if (mine !== sequence.queue) return;
      showError($("queue-error"), error.message);
      clear(document.querySelector("#judging-queue tbody"));
      return;
    }
    if (mine !== sequence.queue) return;
    showError($("queue-error"), "");
    const head = clear(document.querySelector("#judging-queue thead"));
    head.append(el("tr", {}, [
      el("th", { text: "query" }), el("th", { text: "doc" }), el("th", { className: "num", text: "exposure" }),
      el("th", { className: "num", text: "share" }), el("th", { className: "num", text: "best rank" }),
      el("th", { className: "num", text: "query impressions" }), el("th", { className: "num", text: "query judged" }),
    ]));
    const body = clear(document.querySelector("#judging-queue tbody"));
    for (const pair of answer.pairs) {
      body.append(el("tr", { dataset: { queryId: pair.query_id, docId: pair.doc_id } }, [
        el("td", { className: "id" }, [queryLink(pair.query_id)]), el("td", { className: "id", text: pair.doc_id }),
        el("td", { className: "num", text: num(pair.exposure, 3) }), el("td", { className: "num", text: percent(pair.share) }),
        el("td", { className: "num", text: String(pair.best_rank) }),
        el("td", { className: "num", text: num(pair.query_impressions, 0) }),
        el("td", { className: "num", text: num(pair.query_judged_ratio, 3) }),
      ]));
    }
    if (answer.pairs.length === 0) {
      body.append(el("tr", {}, [el("td", { colSpan: 7, className: "empty", text: "nothing unjudged in the top "
                                                                                + answer.k })]));
    }
    $("queue-caption").textContent = "unjudged (query, document) pairs by their share of the top-" + answer.k
      + " exposure of the last " + answer.window + " (" + segmentText(answer.segment) + "; total exposure "
      + num(answer.total_exposure, 3) + "); " + answer.pairs.length + " shown";
  }

  async function downloadQueue() {
    const button = $("download-csv");
    button.disabled = true;
    try {
      const blob = await (await api("judging-queue", queueParams("csv"))).blob();
      const url = URL.createObjectURL(blob);
      const link = el("a", { href: url, download: "judging-queue.csv", hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      // After the click has handed the file to the browser.
      setTimeout(() => URL.revokeObjectURL(url), 10000);
      showError($("queue-error"), "");
    } catch (error) {
      showError($("queue-error"), error.message);
    } finally {
      button.disabled = false;
    }
  }

  // ---- start ----------------------------------------------------------------------------------

  async function loadAll() {
    renderControls();
    $("status").textContent = "loading\u2026";
    await Promise.all([loadSummary(), loadComparisons(), loadQueries(), loadDetail(), loadQueue()]);
    $("status").textContent = "updated " + new Date().toLocaleTimeString();
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  }

  async function start() {
    showError($("error"), "");
    let summary;
    try {
      summary = await (await api("summary", null)).json();
    } catch (error) {
      if (error.status !== 401) showError($("error"), error.message);
      $("status").textContent = "";
      return;
    }
    $("token-form").hidden = true;
    // The segment values are the ones seen in any window, the longest holding them all.
    const longest = summary.windows[summary.windows.length - 1];
    const rows = longest === summary.window ? summary.rows
      : (await (await api("summary", new URLSearchParams({ window: longest }))).json()).rows;
    const values = {};
    for (const label of summary.segment_labels) values[label] = new Set();
    for (const row of [...summary.rows, ...rows]) {
      for (const label of summary.segment_labels) {
        if (row.segment[label] !== undefined && row.segment[label] !== null) values[label].add(row.segment[label]);
      }
    }
    const control = summary.comparisons && summary.comparisons.control;
    meta = { window: summary.window, windows: summary.windows, cutoffs: summary.cutoffs,
             segment_labels: summary.segment_labels, values: {},
             control: control ? control.label + ":" + control.value : null };
    for (const label of summary.segment_labels) meta.values[label] = [...values[label]];
    state = readState();
    await loadAll();
  }

  document.addEventListener("DOMContentLoaded", () => {
    bindControls();
    start();
  });
})();
