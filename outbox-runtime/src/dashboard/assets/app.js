// The outbox dashboard's page. Plain JavaScript, no build step, nothing fetched from elsewhere.
//
// Every value from the database is written into the page as text (text nodes, textContent,
// attributes set one by one), never parsed as markup: an event type or an error holding
// <script> shows as those characters. The Content-Security-Policy forbids inline script anyway.
//
// The token the operator pastes (when the dashboard has one) is kept in this tab's session
// storage, which no other site and no other tab can read, and travels only in the
// Authorization header of the page's requests: never in a cookie, so no other site can make the
// browser send it.
"use strict";

const TOKEN_KEY = "outbox-dashboard-token";

const state = {
  config: null,
  table: null,
  view: "overview",
  eventId: null,
  // The table of the event shown in the event view: the one its link named.
  eventTable: null,
  timer: null,
};

// ---- small helpers -------------------------------------------------------------------------

/** An element with attributes and children; string children become text nodes. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "onclick") node.addEventListener("click", value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

function fmtAge(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const s = Math.max(0, seconds);
  if (s < 1) return s.toFixed(2) + " s";
  if (s < 120) return s.toFixed(0) + " s";
  if (s < 7200) return (s / 60).toFixed(0) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return (s / 86400).toFixed(1) + " d";
}

function fmtTime(iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function fmtCount(n) {
  return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US");
}

function replaceRows(tbody, rows) {
  tbody.replaceChildren(...rows);
}

/** A link to an event's view; it names the event's table, whatever table the picker shows. */
function eventLink(id, table) {
  const href = "#event/" + encodeURIComponent(table) + "/" + encodeURIComponent(id);
  return el("a", { href, class: "mono", "data-event-id": id, "data-event-table": table, text: id });
}

function notice(text, kind) {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.className = kind || "info";
  box.hidden = false;
}

/** The token pasted into the field, else the one kept for this tab. */
function token() {
  return document.getElementById("token").value.trim() || sessionStorage.getItem(TOKEN_KEY) || "";
}

/** Headers of every request: the token, when there is one. */
function authHeaders(headers) {
  const t = token();
  if (t) headers.Authorization = "Bearer " + t;
  return headers;
}

async function getJson(path, params) {
  const url = new URL(path, document.baseURI);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") url.searchParams.set(k, v);
  }
  const response = await fetch(url, { headers: authHeaders({ Accept: "application/json" }) });
  const body = await response.json().catch(() => ({ error: "the server's answer is not JSON" }));
  if (!response.ok) {
    const error = new Error(body.error || response.statusText);
    error.status = response.status;
    throw error;
  }
  return body;
}

// ---- actions -------------------------------------------------------------------------------

/** Ask for confirmation in the page, then send the action with the token. */
function confirmAction(question, path, payload) {
  const bar = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = question;
  bar.hidden = false;
  const yes = document.getElementById("confirm-yes");
  const no = document.getElementById("confirm-no");
  const close = () => {
    bar.hidden = true;
    yes.onclick = null;
    no.onclick = null;
  };
  no.onclick = close;
  yes.onclick = async () => {
    close();
    await sendAction(path, payload);
  };
}

async function sendAction(path, payload) {
  const operator = document.getElementById("operator").value.trim();
  // Without a token the request is still sent, so the server says what is missing.
  const headers = authHeaders({ "Content-Type": "application/json", Accept: "application/json" });
  if (operator) headers["X-Outbox-Operator"] = operator;
  try {
    const response = await fetch(new URL(path, document.baseURI), {
      method: "POST",
      headers,
      body: JSON.stringify(Object.assign({ table: state.table }, payload)),
    });
    const body = await response.json().catch(() => ({ error: response.statusText }));
    if (!response.ok) {
      notice("refused: " + (body.error || response.statusText), "error");
    } else {
      notice(body.message || "done", "ok");
    }
  } catch (e) {
    notice("the action did not reach the dashboard: " + e.message, "error");
  }
  await refresh();
}

function actionButton(label, question, path, payload) {
  if (!state.config || state.config.read_only) return null;
  return el("button", {
    type: "button",
    class: "action",
    text: label,
    onclick: () => confirmAction(question, path, payload),
  });
}

// ---- views ---------------------------------------------------------------------------------

// The parts of each minute's bar, bottom up: where the events enqueued in that minute stand now.
const MINUTE_PARTS = [
  ["delivered", (m) => m.delivered],
  ["open", (m) => m.enqueued - m.delivered - m.exhausted],
  ["exhausted", (m) => m.exhausted],
];

/**
 * Events enqueued per minute over the last hour, each minute's bar split by where its events
 * stand now. The table keeps no delivery time, so this is not a delivery rate: a minute whose
 * bar is not all "delivered" is a minute whose events have not all got through.
 */
function enqueuedChart(points) {
  const width = 600;
  const height = 120;
  const pad = 24;
  const max = Math.max(1, ...points.map((m) => m.enqueued));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height + pad}`, class: "chart", role: "img", "data-chart": "enqueued" });
  const label = svg("title", {});
  label.textContent = "events enqueued per minute over the last hour, by where they stand now: delivered, still open, exhausted";
  chart.append(label);
  const step = width / Math.max(1, points.length);
  points.forEach((m, i) => {
    let base = height;
    for (const [part, count] of MINUTE_PARTS) {
      const v = count(m);
      if (v <= 0) continue;
      const h = (v / max) * (height - 8);
      base -= h;
      const bar = svg("rect", { x: (i * step + 1).toFixed(1), y: base.toFixed(1), width: Math.max(1, step - 2).toFixed(1), height: h.toFixed(1), class: "bar " + part, "data-part": part });
      const tip = svg("title", {});
      tip.textContent = `${fmtTime(m.minute)}: ${fmtCount(m.enqueued)} enqueued, ${fmtCount(m.delivered)} delivered by now, ${fmtCount(m.exhausted)} exhausted`;
      bar.append(tip);
      chart.append(bar);
    }
  });
  const axis = svg("text", { x: 0, y: height + 16, class: "axis" });
  axis.textContent = `-60 min … now; max ${fmtCount(max)} a minute; blue: delivered, grey: still open, red: exhausted`;
  chart.append(axis);
  return chart;
}

function stat(label, value, field, extra) {
  return el("div", { class: "stat " + (extra || "") },
    el("div", { class: "stat-label", text: label }),
    el("div", { class: "stat-value", "data-field": field, text: value }));
}

function renderOverview(data) {
  const root = document.getElementById("overview-tables");
  // Keep what the operator is typing: skip this refresh while an input of the view has the
  // focus, and carry typed values over to the new cards.
  if (root.contains(document.activeElement) && document.activeElement.tagName === "INPUT") return;
  const typed = {};
  for (const input of root.querySelectorAll("article[data-table] input[name=older_than]")) {
    typed[input.closest("article").dataset.table] = input.value;
  }
  const cards = data.tables.map((t) => {
    const delivered = t.delivered.exact
      ? fmtCount(t.delivered.count)
      : t.delivered.count === null
        ? "> " + fmtCount(t.delivered.at_least)
        : "≈ " + fmtCount(t.delivered.count);
    const deliveredLabel = t.delivered.exact ? "delivered (kept)" : "delivered (estimate)";
    const enqueuedLastHour = t.last_hour.reduce((n, m) => n + m.enqueued, 0);
    const deliveredOfLastHour = t.last_hour.reduce((n, m) => n + m.delivered, 0);
    const stuck = t.oldest_pending_age_seconds !== null && t.oldest_pending_age_seconds > 60;
    const purge = state.config.read_only ? null : el("form", { class: "purge" },
      el("label", {}, "purge delivered events enqueued more than ", el("input", { type: "text", name: "older_than", value: typed[t.table] || "7d", size: 5 }), " ago"),
      el("button", {
        type: "button",
        class: "action",
        text: "Purge",
        onclick: (ev) => {
          const older = ev.target.form.elements.older_than.value.trim();
          state.table = t.table;
          confirmAction(`Delete every delivered event enqueued more than ${older} ago from ${t.table}?`, "api/actions/purge", { older_than: older, table: t.table });
        },
      }));
    const latest = t.latest_failures.length === 0
      ? el("p", { class: "empty", text: "No failing or exhausted events." })
      : el("table", { class: "latest" },
        el("thead", {}, el("tr", {}, ...["latest failures", "type", "status", "attempts", "last error"].map((h) => el("th", { text: h })))),
        el("tbody", {}, ...t.latest_failures.map((r) => el("tr", { "data-event-id": r.event_id },
          el("td", {}, eventLink(r.event_id, t.table)),
          el("td", { "data-field": "type", text: `${r.event_type} v${r.event_version}` }),
          el("td", { class: r.status === "exhausted" ? "bad" : "", text: r.status }),
          el("td", { text: `${r.attempts} / ${r.max_attempts}` }),
          el("td", { class: "error", "data-field": "last-error", text: r.last_error || "" })))));
    return el("article", { class: "table-card", "data-table": t.table },
      el("h2", {}, "table ", el("code", { text: t.table })),
      el("div", { class: "stats" },
        stat("pending", fmtCount(t.pending), "pending"),
        stat("processing", fmtCount(t.processing), "processing"),
        stat(deliveredLabel, delivered, "delivered"),
        stat("exhausted", fmtCount(t.exhausted), "exhausted", t.exhausted > 0 ? "bad" : ""),
        stat("oldest pending waits", fmtAge(t.oldest_pending_age_seconds), "oldest-pending-age", stuck ? "bad" : "")),
      el("div", { class: "charts" },
        el("figure", {},
          el("figcaption", {},
            "enqueued per minute, last hour: ",
            el("span", { "data-field": "enqueued-last-hour", text: fmtCount(enqueuedLastHour) }),
            ", of which delivered by now: ",
            el("span", { "data-field": "delivered-of-last-hour", text: fmtCount(deliveredOfLastHour) })),
          enqueuedChart(t.last_hour),
          el("p", { class: "note", text: "The table keeps no delivery time: delivery rates and latency come from the workers' metrics (outbox_delivered_total, outbox_delivery_latency_seconds)." }))),
      ...t.unhandled.map((u) => el("p", { class: "unhandled", "data-field": "unhandled" },
        `no worker handles ${u.event_type} v${u.event_version} since ${new Date(u.since).toLocaleString()}: ${fmtCount(u.waiting)} waiting, not failed (deploy a worker that handles it)`)),
      latest,
      purge);
  });
  root.replaceChildren(...cards);
}

function renderTypes(rows, table) {
  const tbody = document.querySelector("#types-table tbody");
  replaceRows(tbody, rows.map((r) => el("tr", { "data-type": r.event_type },
    el("td", { text: r.event_type }),
    el("td", { text: r.event_version }),
    el("td", { "data-field": "pending", text: fmtCount(r.pending) }),
    el("td", { "data-field": "processing", text: fmtCount(r.processing) }),
    el("td", { "data-field": "exhausted", class: r.exhausted > 0 ? "bad" : "", text: fmtCount(r.exhausted) }),
    el("td", { "data-field": "failures", text: fmtCount(r.failures) }),
    el("td", { "data-field": "enqueued-last-hour", text: fmtCount(r.enqueued_last_hour) }),
    el("td", { "data-field": "delivered-of-last-hour", text: fmtCount(r.delivered_of_last_hour) }),
    el("td", { text: fmtTime(r.last_failure_at) }),
    el("td", { class: "error", text: r.last_error || "" }),
    el("td", {},
      el("a", { href: "#failures", onclick: () => setFilter({ type: r.event_type }) }, "failures"),
      r.exhausted > 0 ? actionButton("Retry exhausted", `Retry all ${r.exhausted} exhausted events of type ${r.event_type}?`, "api/actions/retry-type", { event_type: r.event_type, table }) : null))));
}

function filterValues() {
  const form = document.getElementById("failure-filter");
  const out = {};
  for (const name of ["state", "type", "aggregate", "since", "error"]) out[name] = form.elements[name].value.trim();
  return out;
}

function setFilter(values) {
  const form = document.getElementById("failure-filter");
  for (const name of ["state", "type", "aggregate", "since", "error"]) form.elements[name].value = values[name] || "";
}

function renderFailures(rows, table) {
  const tbody = document.querySelector("#failures-table tbody");
  document.getElementById("failures-empty").hidden = rows.length > 0;
  replaceRows(tbody, rows.map((r) => el("tr", { "data-event-id": r.event_id, "data-status": r.status },
    el("td", {}, eventLink(r.event_id, table)),
    el("td", { "data-field": "type", text: `${r.event_type} v${r.event_version}` }),
    el("td", { "data-field": "status", class: r.status === "exhausted" ? "bad" : "", text: r.status }),
    el("td", { text: r.aggregate_id === null ? "-" : `${r.aggregate_type || ""} ${r.aggregate_id}` }),
    el("td", { text: `${r.attempts} / ${r.max_attempts}` }),
    el("td", { text: r.lease_expiries }),
    el("td", { text: r.handler_failures }),
    el("td", { class: "error", "data-field": "last-error", text: r.last_error || "" }),
    el("td", { "data-field": "claimed-by", text: r.claimed_by || "-" }),
    el("td", { text: fmtTime(r.updated_at) }),
    el("td", {}, r.status === "exhausted"
      ? actionButton("Retry", `Retry event ${r.event_id} (${r.event_type})?`, "api/actions/retry", { event_id: r.event_id, table })
      : null))));
  const type = filterValues().type;
  const button = document.getElementById("retry-type");
  button.hidden = state.config.read_only || !type;
  button.textContent = `Retry all exhausted of type ${type}`;
}

function renderClaims(rows, table) {
  document.getElementById("claims-empty").hidden = rows.length > 0;
  const workers = new Map();
  for (const r of rows) {
    const w = workers.get(r.claimed_by) || { n: 0, min: Infinity, max: -Infinity, expired: 0 };
    w.n += 1;
    w.min = Math.min(w.min, r.lease_remaining_seconds);
    w.max = Math.max(w.max, r.lease_remaining_seconds);
    if (r.lease_remaining_seconds <= 0) w.expired += 1;
    workers.set(r.claimed_by, w);
  }
  replaceRows(document.querySelector("#workers-table tbody"), [...workers.entries()].map(([name, w]) => el("tr", { "data-worker": name || "" },
    el("td", { text: name || "-" }),
    el("td", { "data-field": "claims", text: w.n }),
    el("td", { text: fmtAge(w.min) }),
    el("td", { text: fmtAge(w.max) }),
    el("td", { class: w.expired > 0 ? "bad" : "", text: w.expired }))));
  replaceRows(document.querySelector("#claims-table tbody"), rows.map((r) => el("tr", { "data-event-id": r.event_id },
    el("td", {}, eventLink(r.event_id, table)),
    el("td", { text: `${r.event_type} v${r.event_version}` }),
    el("td", { text: r.claimed_by || "-" }),
    el("td", { text: r.attempts }),
    el("td", { text: r.claim_version }),
    el("td", { class: r.lease_remaining_seconds <= 0 ? "bad" : "", text: r.lease_remaining_seconds <= 0 ? "expired " + fmtAge(-r.lease_remaining_seconds) + " ago" : fmtAge(r.lease_remaining_seconds) }))));
}

function renderContracts(rows) {
  const words = {
    ok: "compiled here, same shape",
    mismatch: "compiled here with ANOTHER shape: workers refuse to start",
    not_compiled: "not compiled here: this binary cannot decode it",
    unregistered: "compiled here, not registered (no generated migration applied)",
  };
  replaceRows(document.querySelector("#contracts-table tbody"), rows.map((r) => el("tr", { "data-contract": `${r.event_type} v${r.event_version}` },
    el("td", { text: r.event_type }),
    el("td", { text: r.event_version }),
    el("td", { class: "mono", text: r.registered_fingerprint ? r.registered_fingerprint.slice(0, 16) + "…" : "-" }),
    el("td", { text: r.compiled_fingerprint ? "yes" : "no" }),
    el("td", { class: r.state === "ok" ? "" : "bad", "data-field": "state", text: words[r.state] || r.state }))));
}

function renderIntegrity(r) {
  const rule = (name, state) => el("tr", { "data-rule": name },
    el("td", { text: name }),
    el("td", { class: state.state === "on" ? "" : "bad", "data-field": "state",
      text: state.state === "on" ? "on" : state.state === "missing" ? "MISSING: generate and apply migrations (outbox migrate)" : "OFF: " + state.why }));
  replaceRows(document.querySelector("#integrity-rules tbody"), [
    rule("every inserted event gets its queue row", r.queue_row_trigger),
    rule("a queue row cannot outlive its event", r.queue_row_foreign_key),
  ]);
  const count = (id, n, shown) => {
    const p = document.getElementById(id);
    p.textContent = n === 0 ? "none" : `${n} found` + (shown < n ? `, the first ${shown} listed` : "");
    p.className = n === 0 ? "" : "bad";
  };
  count("integrity-orphans-count", r.orphan_queue_rows, r.orphan_queue_row_sample.length);
  replaceRows(document.querySelector("#integrity-orphans tbody"), r.orphan_queue_row_sample.map((o) => el("tr", {},
    el("td", { text: o.id }),
    el("td", { text: o.status }),
    el("td", { text: o.attempts }),
    el("td", { text: o.last_error || "-" }))));
  count("integrity-unqueued-count", r.never_claimed_events, r.never_claimed_event_sample.length);
  replaceRows(document.querySelector("#integrity-unqueued tbody"), r.never_claimed_event_sample.map((e) => el("tr", { "data-event": e.event_id },
    el("td", { text: e.id }),
    el("td", { class: "mono", text: e.event_id }),
    el("td", { text: e.event_type }),
    el("td", { text: e.event_version }),
    el("td", { text: e.operation_key }),
    el("td", { text: e.created_at }))));
}

function renderEvent(e, table) {
  document.getElementById("event-id").textContent = e.event_id;
  document.getElementById("event-table").textContent = table;
  const q = e.queue;
  const facts = [
    ["status", e.status],
    ["type", `${e.event_type} v${e.event_version}`],
    ["operation key", e.operation_key],
    ["aggregate", e.aggregate_id === null ? "-" : `${e.aggregate_type || ""} ${e.aggregate_id} (version ${e.aggregate_version ?? "-"})`],
    ["written", fmtTime(e.created_at)],
  ];
  // Only an event not delivered has a delivery state: the completion deletes it.
  if (q) {
    facts.push(
      ["attempts", `${q.attempts} / ${q.max_attempts}`],
      ["lease expiries", q.lease_expiries],
      ["handler failures", q.handler_failures],
      ["last claim by", q.claimed_by || "-"],
      ["claims (fencing token)", q.claim_version],
      ["lease until", fmtTime(q.lease_until)],
      ["available at", fmtTime(q.available_at)],
      ["last change", fmtTime(q.updated_at)],
      ["exhausted", fmtTime(q.exhausted_at)]);
  } else {
    facts.push(["delivery state", "none kept: a delivered event keeps no delivery time, attempts or errors"]);
  }
  const dl = el("dl", { class: "facts" });
  for (const [k, v] of facts) dl.append(el("dt", { text: k }), el("dd", { "data-field": k, text: String(v) }));
  const history = el("ol", { class: "history" }, ...e.history.map((h) => el("li", {}, el("span", { class: "when", text: h.at ? fmtTime(h.at) : "" }), " ", h.what)));
  const payload = e.payload_shown
    ? el("pre", { class: "json", "data-field": "payload", text: JSON.stringify(e.payload, null, 2) })
    : el("p", { class: "hidden-payload", "data-field": "payload", text: "payload hidden (start the dashboard with --show-payloads to see payloads; they can hold personal data)" });
  const retry = e.status === "exhausted"
    ? actionButton("Retry this event", `Retry event ${e.event_id} (${e.event_type}) in ${table}?`, "api/actions/retry", { event_id: e.event_id, table })
    : null;
  document.getElementById("event-body").replaceChildren(
    dl,
    el("h3", { text: "last error" }),
    el("pre", { class: "error", "data-field": "last-error", text: (q && q.last_error) || "-" }),
    el("h3", { text: "history (as far as the rows tell it)" }),
    history,
    el("h3", { text: "headers" }),
    el("pre", { class: "json", "data-field": "headers", text: JSON.stringify(e.headers, null, 2) }),
    el("h3", { text: "payload" }),
    payload,
    retry);
}

// ---- navigation and refresh ----------------------------------------------------------------

function route() {
  const hash = decodeURIComponent(location.hash.replace(/^#/, ""));
  if (hash.startsWith("event/")) {
    // `event/<table>/<id>`, or `event/<id>` for the table in the picker.
    const rest = hash.slice("event/".length);
    const slash = rest.lastIndexOf("/");
    state.view = "event";
    state.eventId = slash < 0 ? rest : rest.slice(slash + 1);
    state.eventTable = slash < 0 ? state.table : rest.slice(0, slash);
  } else {
    state.view = ["overview", "types", "failures", "claims", "contracts", "integrity"].includes(hash) ? hash : "overview";
  }
  for (const section of document.querySelectorAll(".view")) section.hidden = section.id !== "view-" + state.view;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("current", a.dataset.view === state.view);
  refresh();
}

let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  const table = state.table;
  try {
    if (state.view === "overview") renderOverview(await getJson("api/overview"));
    else if (state.view === "types") renderTypes(await getJson("api/types", { table }), table);
    else if (state.view === "failures") renderFailures(await getJson("api/failures", Object.assign({ table }, filterValues())), table);
    else if (state.view === "claims") renderClaims(await getJson("api/claims", { table }), table);
    else if (state.view === "contracts") renderContracts(await getJson("api/contracts"));
    else if (state.view === "integrity") {
      // Reads the table whole: only when the view opens, its table changes, or on "Check again".
      if (state.integrityTable !== table) {
        state.integrityTable = table;
        renderIntegrity(await getJson("api/integrity", { table }));
      }
    }
    else if (state.view === "event") {
      const eventTable = state.eventTable;
      renderEvent(await getJson("api/events/" + encodeURIComponent(state.eventId), { table: eventTable }), eventTable);
    }
    const updated = document.getElementById("updated");
    updated.textContent = "updated " + new Date().toLocaleTimeString() + `, every ${state.config.refresh_seconds} s`;
    updated.classList.remove("bad");
  } catch (e) {
    const updated = document.getElementById("updated");
    updated.textContent = "refresh failed: " + e.message;
    updated.classList.add("bad");
  } finally {
    refreshing = false;
  }
}

/**
 * Read the configuration with the token at hand and show the views. A dashboard with a token
 * answers 401 until the token is pasted: then only the token field shows, and pasting it (Use)
 * calls this again.
 */
async function load() {
  try {
    state.config = await getJson("api/config");
  } catch (e) {
    if (e.status === 401) {
      document.getElementById("auth").hidden = false;
      document.getElementById("mode").textContent = "locked: this dashboard needs its token";
      notice(e.message, "error");
      document.getElementById("token").focus();
    } else {
      notice("cannot read the dashboard's configuration: " + e.message, "error");
    }
    return;
  }
  document.getElementById("notice").hidden = true;
  const select = document.getElementById("table");
  if (state.table === null) {
    select.replaceChildren(...state.config.tables.map((t) => el("option", { value: t, text: t })));
    state.table = state.config.tables[0];
  }
  const mode = document.getElementById("mode");
  mode.classList.toggle("read-only", state.config.read_only);
  if (!state.config.read_only) mode.textContent = "actions enabled: each is confirmed and audited";
  else if (state.config.actions_enabled) mode.textContent = "view-only token: actions need the action token";
  else mode.textContent = "read-only: started without an action token, actions are off";
  // The token field shows whenever the dashboard has a token, to paste another one.
  document.getElementById("auth").hidden = !state.config.token_required && state.config.read_only;
  route();
  if (state.timer === null) state.timer = setInterval(refresh, state.config.refresh_seconds * 1000);
}

/** Keep the pasted token for this tab, and read the configuration again with it. */
function useToken(ev) {
  ev.preventDefault();
  const field = document.getElementById("token");
  const value = field.value.trim();
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
  field.value = "";
  field.placeholder = value ? "token kept for this tab (paste another to change it)" : "paste the dashboard token";
  load();
}

function start() {
  const select = document.getElementById("table");
  select.addEventListener("change", () => {
    state.table = select.value;
    refresh();
  });
  document.getElementById("auth").addEventListener("submit", useToken);
  if (sessionStorage.getItem(TOKEN_KEY)) {
    document.getElementById("token").placeholder = "token kept for this tab (paste another to change it)";
  }
  document.getElementById("failure-filter").addEventListener("submit", (ev) => {
    ev.preventDefault();
    refresh();
  });
  document.getElementById("retry-type").addEventListener("click", () => {
    const type = filterValues().type;
    confirmAction(`Retry every exhausted event of type ${type}?`, "api/actions/retry-type", { event_type: type });
  });
  document.getElementById("integrity-check").addEventListener("click", () => {
    state.integrityTable = null;
    refresh();
  });
  window.addEventListener("hashchange", () => {
    // Leaving and reopening the Integrity view checks again.
    state.integrityTable = null;
    if (state.config) route();
  });
  load();
}

document.addEventListener("DOMContentLoaded", start);
