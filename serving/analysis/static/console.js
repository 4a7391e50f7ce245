"use strict";
// The analysis console: every number on the page comes from the JSON routes beside it (the routes
// `llm-serving analyze` mirrors); nothing is computed here but layout and colour.

const KEY_STORAGE = "llm-serving-analysis-key";
const BASE = location.pathname.replace(/\/+$/, ""); // the app's route prefix, e.g. /analysis
const KV_DELAY_MS = 150; // typing pause before the calculator asks the route
const state = { arch: null, kvAsked: 0, charts: {}, requests: null };
const TRACE_ERRORS = new Set(["trace_backend_unavailable"]); // a 503 that says why
window.analysisConsole = state; // the browser tests read the drawn chart from here

function $(selector, root = document) { return root.querySelector(selector); }
function panel(id) { return document.getElementById(id); }

function el(tag, props = {}, ...children) {
  const { dataset = {}, ...rest } = props; // dataset is read-only: its entries are copied
  const node = Object.assign(document.createElement(tag), rest);
  Object.assign(node.dataset, dataset);
  node.append(...children);
  return node;
}

function num(value) {
  if (value === null || value === undefined) return "-";
  if (Number.isInteger(value)) return value.toLocaleString("en-US");
  return value.toLocaleString("en-US", { maximumSignificantDigits: 4 });
}

function mib(bytes) { return `${(bytes / 2 ** 20).toLocaleString("en-US", { maximumFractionDigits: 1 })} MiB`; }

function showMessage(where, text, kind = "error") {
  const box = $(".message", where);
  box.textContent = text || "";
  box.className = `message ${kind}`;
  box.hidden = !text;
}

function apiKey() { return sessionStorage.getItem(KEY_STORAGE) || ""; }

function requestHeaders(hasBody) {
  const headers = hasBody ? { "Content-Type": "application/json" } : {};
  if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
  return headers;
}

// The OpenAI error's code, when the body is one.
function errorCode(body) {
  try { return JSON.parse(body).error.code || null; } catch (_) { return null; }
}

function errorText(status, body) {
  let message = body.trim() || "(empty answer)";
  try { message = JSON.parse(body).error.message; } catch (_) { /* not an OpenAI error body */ }
  if (status === 401) message += " Enter the analysis app's API key at the top of the page.";
  if (status === 503 && !TRACE_ERRORS.has(errorCode(body))) message += " The analysis replica is busy; try again in a moment.";
  return `${status}: ${message}`;
}

// GET (no payload) or POST JSON to a route of this app; resolves to JSON, or text for HTML.
async function call(path, payload, asText = false) {
  const init = { method: payload ? "POST" : "GET", headers: requestHeaders(Boolean(payload)) };
  if (payload) init.body = JSON.stringify(payload);
  let response;
  try {
    response = await fetch(BASE + path, init);
  } catch (err) {
    throw new Error(`cannot reach ${BASE}${path}: ${err.message}`);
  }
  const body = await response.text();
  if (!response.ok) throw Object.assign(new Error(errorText(response.status, body)), { code: errorCode(body) });
  return asText ? body : JSON.parse(body);
}

function withArch(params = {}) {
  const query = new URLSearchParams(params);
  if (state.arch) query.set("arch", state.arch);
  const text = query.toString();
  return text ? `?${text}` : "";
}

function rowsTable(table, rows) {
  table.replaceChildren(...rows.map(([field, label, value]) =>
    el("tr", { className: `row-${field}` }, el("td", {}, label),
      el("td", { className: "value", dataset: { field } }, value))));
}

// --- architecture card -------------------------------------------------------------------------

function cardRows(body) {
  const a = body.architecture, p = body.parameters;
  const perLayer = new Set(p.per_layer).size === 1
    ? `${num(p.per_layer[0])} x ${p.per_layer.length} = ${num(p.layers_total)}`
    : p.per_layer.map(num).join(", ");
  return [
    ["architecture", "architecture", `${a.architectures.join(", ") || "-"} (${a.model_type})`],
    ["hidden_size", "hidden size", num(a.hidden_size)],
    ["num_layers", "layers", num(a.num_layers)],
    ["num_query_heads", "query heads", num(a.num_query_heads)],
    ["num_kv_heads", "KV heads", num(a.num_kv_heads)],
    ["gqa_group_size", "GQA group", `${num(a.gqa_group_size)} query heads per KV head`],
    ["head_dim", "head dim", num(a.head_dim)],
    ["intermediate_size", "intermediate size", num(a.intermediate_size)],
    ["vocab_size", "vocab size", num(a.vocab_size)],
    ["max_position_embeddings", "max positions", num(a.max_position_embeddings)],
    ["rope_theta", "RoPE theta", num(a.rope_theta)],
    ["tie_word_embeddings", "tied embeddings", a.tie_word_embeddings ? "yes" : "no"],
    ["dtype", "dtype", a.dtype],
    ["parameters", "parameters", num(p.total)],
    ["embedding", "  embedding", num(p.embedding)],
    ["lm_head", "  LM head", p.lm_head_tied ? "tied to the embedding" : num(p.lm_head)],
    ["per_layer", "  per layer", perLayer],
    ["other", "  other", num(p.other)],
    ["kv_cache_bytes_per_token", "KV cache", `${num(body.kv_cache_bytes_per_token)} bytes per token (${a.dtype})`],
  ];
}

async function loadCard() {
  const where = panel("architecture");
  showMessage(where, "loading ...", "info");
  const body = await call(`/config${withArch()}`);
  rowsTable($(".card", where), cardRows(body));
  $("#model-name").textContent = body.model;
  showMessage(where, "");
}

// --- module tree -------------------------------------------------------------------------------

// Flat rows (definition order, each with its depth) -> nested nodes.
function nestModules(rows) {
  const roots = [], parents = [];
  for (const row of rows) {
    const node = { row, children: [] };
    parents.length = row.depth;
    (row.depth === 0 || !parents[row.depth - 1] ? roots : parents[row.depth - 1].children).push(node);
    parents[row.depth] = node;
  }
  return roots;
}

function moduleLine(row) {
  const leaf = row.depth === 0 ? row.name : row.name.split(".").pop();
  const shapes = Object.entries(row.weights).map(([name, shape]) => `${name} ${shape.join("x")}`);
  return [
    el("span", { className: "name" }, leaf), " ",
    el("span", { className: "type" }, row.type), " ",
    el("span", { className: "params" }, `${num(row.parameters)} params`), " ",
    el("span", { className: "shapes" }, shapes.join(", ")),
  ];
}

function moduleNode(node) {
  const line = moduleLine(node.row);
  if (!node.children.length) return el("div", { className: "leaf", dataset: { module: node.row.name } }, ...line);
  const children = el("div", { className: "children" }, ...node.children.map(moduleNode));
  const details = el("details", { dataset: { module: node.row.name } }, el("summary", {}, ...line), children);
  details.open = node.row.depth === 0; // the root open: its children are the model's parts
  return details;
}

async function loadTree() {
  const where = panel("modules");
  showMessage(where, "loading ...", "info");
  const body = await call(`/modules${withArch()}`);
  $(".tree", where).replaceChildren(...nestModules(body.modules).map(moduleNode));
  showMessage(where, "");
}

// --- KV-cache calculator -----------------------------------------------------------------------

function kvRows(r) {
  return [
    ["bytes_per_token", "bytes per token", `${num(r.bytes_per_token)} = ${r.formula}`],
    ["total_bytes", "total", `${num(r.total_bytes)} bytes (${mib(r.total_bytes)}) for ${num(r.tokens)} tokens x ${num(r.batch)}`],
    ["mha_bytes_per_token", "full MHA would need", `${num(r.mha.bytes_per_token)} bytes per token, ${num(r.mha.total_bytes)} in total`],
    ["saving_factor", "GQA saving", `${num(r.saving.factor)}x, ${num(r.saving.bytes)} bytes`],
    ["tokens_fit", `tokens in ${num(r.budget.memory_gb)} GiB`, `${num(r.budget.tokens_fit)} (full MHA: ${num(r.budget.tokens_fit_mha)})`],
    ["sequences_fit", "sequences that fit", `${num(r.budget.sequences_fit)} of ${num(r.tokens)} tokens`],
  ];
}

async function updateKv() {
  const where = panel("kv-cache");
  const asked = ++state.kvAsked;
  const params = Object.fromEntries(new FormData($("form", where)));
  try {
    const report = await call(`/kv-cache${withArch(params)}`);
    if (asked !== state.kvAsked) return; // a newer input's answer is (or will be) shown
    rowsTable($(".results", where), kvRows(report));
    showMessage(where, "");
  } catch (err) {
    if (asked !== state.kvAsked) return;
    $(".results", where).replaceChildren();
    showMessage(where, err.message);
  }
}

let kvTimer = null;
function scheduleKv() {
  clearTimeout(kvTimer);
  kvTimer = setTimeout(updateKv, KV_DELAY_MS);
}

// --- attention: layer x head grid and bertviz's head view ---------------------------------------

// Darker blue = more weight; the square root lifts the small weights most heads spread around.
function weightColour(weight) {
  const t = Math.sqrt(Math.max(0, Math.min(1, weight)));
  const channel = (from, to) => Math.round(from + (to - from) * t);
  return `rgb(${channel(255, 8)}, ${channel(255, 48)}, ${channel(255, 107)})`;
}

function headCanvas(layer, head, weights) {
  const size = weights.length;
  const canvas = el("canvas", {
    width: size, height: size, className: "cell", title: `layer ${layer} head ${head}`,
    dataset: { layer, head },
  });
  const ctx = canvas.getContext("2d");
  weights.forEach((row, query) => row.forEach((weight, key) => {
    ctx.fillStyle = weightColour(weight);
    ctx.fillRect(key, query, 1, 1);
  }));
  return canvas;
}

function drawHeatmap(grid, report) {
  const cells = [el("span", { className: "label" }, "")];
  report.heads.forEach((head) => cells.push(el("span", { className: "label" }, `head ${head}`)));
  for (const layer of report.attention) {
    cells.push(el("span", { className: "label" }, `layer ${layer.layer}`));
    layer.heads.forEach((h) => cells.push(headCanvas(layer.layer, h.head, h.weights)));
  }
  grid.style.gridTemplateColumns = `auto repeat(${report.heads.length}, 46px)`;
  grid.replaceChildren(...cells);
}

// The head view's height follows its token count: grow the frame once bertviz has drawn.
function showHeadView(frame, html) {
  frame.parentElement.hidden = false;
  frame.onload = () => setTimeout(() => {
    frame.style.height = `${Math.max(160, frame.contentDocument.body.scrollHeight + 24)}px`;
  }, 300);
  frame.srcdoc = html;
}

async function showAttention(event) {
  event.preventDefault();
  const where = panel("attention");
  const prompt = $("input[name=prompt]", where).value;
  showMessage(where, "running the prompt through every layer ...", "info");
  $(".heatmap", where).replaceChildren();
  $(".head-view-box", where).hidden = true; // no stale view of an earlier prompt
  try {
    const report = await call("/attention", { prompt });
    drawHeatmap($(".heatmap", where), report);
    showMessage(where, `${report.tokens.length} tokens: ${report.tokens.map((t) => JSON.stringify(t)).join(" ")}`, "info");
    showHeadView($(".head-view", where), await call("/attention?format=html", { prompt }, true));
  } catch (err) {
    showMessage(where, err.message);
  }
}

// --- generation trace --------------------------------------------------------------------------

const TRACE_SERIES = [
  { mode: "no-cache", stroke: "#c0392b" },
  { mode: "kv-cache", stroke: "#1f6fb2" },
];

function traceChart(container, traces) {
  const positions = traces[0].latencies_ms.map((_, i) => i + 1);
  const options = {
    width: Math.max(480, container.clientWidth), height: 320,
    scales: { x: { time: false } },
    axes: [{ label: "generated token (position)", incrs: [1, 2, 5, 10, 20, 50] }, { label: "ms per token" }],
    series: [{ label: "token" }, ...TRACE_SERIES.map((s) => ({
      label: s.mode, stroke: s.stroke, width: 2, points: { show: true, size: 5 },
    }))],
  };
  container.replaceChildren();
  return new uPlot(options, [positions, ...traces.map((t) => t.latencies_ms)], container);
}

function fitLine(trace) {
  const slope = trace.growth.slope_ms_per_token;
  const growth = slope === null ? "no fit (one token)" : `${slope >= 0 ? "+" : ""}${slope.toFixed(3)} ms per token of context`;
  return `${trace.mode}: ${growth}; first token ${num(trace.first_token_ms)} ms, total ${num(trace.total_ms)} ms`;
}

async function runTrace(event) {
  event.preventDefault();
  const where = panel("trace");
  const form = Object.fromEntries(new FormData($("form", where)));
  const payload = { prompt: form.prompt, max_new_tokens: Number(form.max_new_tokens) };
  $(".fit", where).replaceChildren();
  try {
    const traces = [];
    for (const { mode } of TRACE_SERIES) { // one after the other: the replica times one at a time
      showMessage(where, `decoding ${payload.max_new_tokens} tokens, ${mode} ...`, "info");
      traces.push(await call("/generation-trace", { ...payload, mode }));
    }
    state.charts.trace = traceChart($(".chart", where), traces);
    $(".fit", where).replaceChildren(...traces.map((t) => el("div", {}, fitLine(t))));
    showMessage(where, `generated: ${JSON.stringify(traces[0].text)}`, "info");
  } catch (err) {
    showMessage(where, err.message);
  }
}

// --- requests: timelines from the platform's traces ---------------------------------------------

const SVG_NS = "http://www.w3.org/2000/svg";
const PHASES = [
  { key: "queue", seconds: "queue_s", colour: "#b8bfcc" },
  { key: "prefill", seconds: "prefill_s", colour: "#e08a1e" },
  { key: "decode", seconds: "decode_s", colour: "#1f6fb2" },
];
const TIMELINE = { row: 14, gap: 3, laneGap: 14, label: 170, top: 30, axis: 30, right: 16 };
const TICK_STEPS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600];

function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

function ms(seconds) { return `${num(seconds * 1000)} ms`; }

// One lane per replica (in name order), its requests by arrival.
function lanes(requests) {
  const byReplica = new Map();
  for (const r of [...requests].sort((a, b) => a.arrival - b.arrival)) {
    if (!byReplica.has(r.replica)) byReplica.set(r.replica, []);
    byReplica.get(r.replica).push(r);
  }
  return [...byReplica.entries()].sort(([a], [b]) => a.localeCompare(b));
}

function barTitle(r, t0) {
  const routed = r.routing_policy ? `routed by ${r.routing_policy}: ${r.routing_reason || "-"}` : "no routing decision (sent to the model's app)";
  return [
    `${r.request_id || "(no request id)"} on replica ${r.replica}${r.model ? ` (${r.model})` : ""}`,
    `tokens: ${num(r.prompt_tokens)} prompt, ${num(r.completion_tokens)} completion`,
    `arrived at +${ms(r.arrival - t0)}; queue ${ms(r.queue_s)}, prefill ${ms(r.prefill_s)}, decode ${ms(r.decode_s)}; ended at +${ms(r.end - t0)}`,
    routed,
    `trace ${r.trace_id}`,
  ].join("\n");
}

function requestBar(r, t0, x, y) {
  const start = r.arrival - t0;
  const bar = svg("g", { class: "bar", "data-request-id": r.request_id || "", "data-replica": r.replica,
    "data-start": start, "data-end": r.end - t0 }, svg("title", {}, barTitle(r, t0)));
  let at = start;
  for (const phase of PHASES) {
    const seconds = r[phase.seconds];
    bar.append(svg("rect", { class: `segment ${phase.key}`, x: x(at), y, height: TIMELINE.row,
      width: Math.max(0, x(at + seconds) - x(at)), fill: phase.colour }));
    at += seconds;
  }
  return bar;
}

function timeAxis(x, span, y, width) {
  const step = TICK_STEPS.find((s) => span / s <= 10) || TICK_STEPS[TICK_STEPS.length - 1];
  const axis = svg("g", { class: "axis" },
    svg("line", { x1: x(0), x2: x(span), y1: y, y2: y, stroke: "#6b7280" }),
    svg("text", { x: width - TIMELINE.right, y: y + 26, "text-anchor": "end" }, "seconds since the first arrival"));
  for (let t = 0; t <= span + 1e-9; t += step) {
    axis.append(svg("line", { x1: x(t), x2: x(t), y1: y, y2: y + 4, stroke: "#6b7280" }),
      svg("text", { x: x(t), y: y + 15, "text-anchor": "middle" }, num(Number(t.toPrecision(6)))));
  }
  return axis;
}

function legend() {
  return svg("g", { class: "legend" }, ...PHASES.map((phase, i) => svg("g", {},
    svg("rect", { x: TIMELINE.label + i * 90, y: 6, width: 12, height: 12, fill: phase.colour }),
    svg("text", { x: TIMELINE.label + i * 90 + 17, y: 16 }, phase.key))));
}

function drawTimeline(container, requests) {
  const t0 = Math.min(...requests.map((r) => r.arrival));
  const span = Math.max(...requests.map((r) => Math.max(r.end, r.arrival + r.queue_s + r.prefill_s + r.decode_s))) - t0 || 1e-3;
  const width = Math.max(640, container.clientWidth);
  const x = (t) => TIMELINE.label + (t / span) * (width - TIMELINE.label - TIMELINE.right);
  const groups = [];
  let y = TIMELINE.top;
  for (const [replica, rows] of lanes(requests)) {
    const height = rows.length * (TIMELINE.row + TIMELINE.gap) + TIMELINE.gap;
    groups.push(svg("g", { class: "lane", "data-replica": replica },
      svg("rect", { class: "lane-bg", x: TIMELINE.label, y, width: width - TIMELINE.label - TIMELINE.right, height }),
      svg("text", { class: "lane-label", x: TIMELINE.label - 8, y: y + 12, "text-anchor": "end" }, replica),
      svg("text", { class: "lane-count", x: TIMELINE.label - 8, y: y + 26, "text-anchor": "end" }, `${rows.length} requests`),
      ...rows.map((r, i) => requestBar(r, t0, x, y + TIMELINE.gap + i * (TIMELINE.row + TIMELINE.gap)))));
    y += Math.max(height, 32) + TIMELINE.laneGap;
  }
  const height = y + TIMELINE.axis;
  container.replaceChildren(svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": "request timelines" }, legend(), ...groups, timeAxis(x, span, y - TIMELINE.laneGap / 2, width)));
  return t0;
}

async function loadRequests() {
  const where = panel("requests");
  const limit = $("input[name=limit]", where).value || "50";
  showMessage(where, "reading the requests' spans ...", "info");
  let body;
  try {
    body = await call(`/requests?${new URLSearchParams({ limit })}`);
  } catch (err) {
    state.requests = null;
    $(".timeline", where).replaceChildren();
    showMessage(where, err.message, err.code === "tracing_off" ? "info" : "error");
    return;
  }
  state.requests = body;
  if (!body.requests.length) {
    $(".timeline", where).replaceChildren();
    showMessage(where, `No request traced in the last ${num(body.window_s / 60)} minutes of project ${body.project}: send a few to a model (tracing keeps tracing.sample_ratio of them) and press Refresh.`, "info");
    return;
  }
  const t0 = drawTimeline($(".timeline", where), body.requests);
  showMessage(where, `${body.requests.length} requests on ${body.replicas.length} replicas, from ${new Date(t0 * 1000).toLocaleTimeString()}.`, "info");
}

function showRequests(event) {
  event.preventDefault();
  loadRequests();
}

// --- model source, API key, start --------------------------------------------------------------

const WEIGHT_PANELS = { attention: "Show attention", trace: "Trace" };

function markWeightPanels() {
  for (const [id, button] of Object.entries(WEIGHT_PANELS)) {
    const where = panel(id);
    $("button", where).disabled = Boolean(state.arch);
    showMessage(where, state.arch
      ? `${state.arch} is an architecture without weights: attention and timing need the served model (pick it above).`
      : `Runs the served model on your prompt: press "${button}".`, "info");
  }
}

async function guarded(id, load) {
  try { await load(); } catch (err) { showMessage(panel(id), err.message); }
}

async function loadArchitecturePanels() {
  markWeightPanels();
  await Promise.all([guarded("architecture", loadCard), guarded("modules", loadTree), updateKv()]);
}

async function loadSources() {
  const select = $("#source");
  const body = await call("/architectures");
  select.replaceChildren(
    el("option", { value: "" }, `${body.model} (served)`),
    ...body.shipped.map((name) => el("option", { value: name }, `${name} (config only, no weights)`)),
  );
  select.value = state.arch || "";
}

async function start() {
  const page = $("header");
  showMessage(page, "");
  try {
    await loadSources();
  } catch (err) {
    showMessage(page, err.message);
  }
  await Promise.all([loadArchitecturePanels(), loadRequests()]);
}

function init() {
  const key = $("#api-key");
  key.value = apiKey();
  key.addEventListener("change", () => { sessionStorage.setItem(KEY_STORAGE, key.value.trim()); start(); });
  $("#source").addEventListener("change", (e) => { state.arch = e.target.value || null; loadArchitecturePanels(); });
  const kvForm = $("#kv-cache form");
  kvForm.addEventListener("input", scheduleKv);
  kvForm.addEventListener("submit", (e) => { e.preventDefault(); updateKv(); });
  $("#attention form").addEventListener("submit", showAttention);
  $("#trace form").addEventListener("submit", runTrace);
  $("#requests form").addEventListener("submit", showRequests);
  start();
}

init();
