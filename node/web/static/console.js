// hero-node console: draws the node from its live feed (/api/events, server-sent events).
// Every string from the node is put in the page as text (never as HTML): job output and
// dead-letter details are whatever a script or a peer wrote.
"use strict";

const COLOURS = {
  waiting_for_prerequisites: "#9aa0a6", dispatched: "#4a90d9", started: "#f5a623",
  finished: "#2e9d5b", error: "#d9443c",
};
const SVG = "http://www.w3.org/2000/svg";
let actions = false;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function badge(status) { return el("span", { class: "badge st-" + status }, status || "?"); }

function ago(now, stamp) {
  if (!stamp) return "—";
  const s = Math.max(0, now - stamp);
  return s < 60 ? s + " s ago" : s < 3600 ? Math.floor(s / 60) + " min ago"
    : Math.floor(s / 3600) + " h ago";
}

function table(head, rows) {
  if (!rows.length) return el("p", { class: "muted" }, "none");
  return el("table", {}, el("thead", {}, el("tr", {}, head.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows));
}

function fill(id, ...content) {
  document.querySelector("#" + id + " .body").replaceChildren(...content.flat());
}

function drawNode(s) {
  const n = s.node;
  document.getElementById("node-name").textContent = n.name;
  document.getElementById("node-id").textContent = n.id;
  const counters = Object.entries(n.counters).map(([k, v]) => el("span", { class: "badge" }, k + " " + v));
  fill("node",
    el("p", {}, "listen ", el("span", { class: "mono" }, n.ws_url || "?"), " · pid ", n.pid,
      " · started ", ago(s.now, Number(n.started_at))),
    // docs/security/sandbox.md: none (no sandbox) and refused (no job runs) are loud
    el("p", { id: "isolation" }, "isolation ", el("span", { class: "badge iso-" + (n.isolation || "unknown") },
      n.isolation || "?"), " ", el("span", { class: "muted" }, n.isolation_why || "")),
    el("div", { class: "counters" }, counters.length ? counters : el("span", { class: "muted" }, "no counters yet")));
}

// -- the grid: this node and each peer as a card ------------------------------------------------

function fact(label, ...value) {
  return el("div", { class: "fact" }, el("span", { class: "muted" }, label), el("span", {}, ...value));
}

function summaryFacts(sum) {
  const facts = [fact("queued", sum.queued), fact("dead letters", sum.dead_letters),
    fact("runners", sum.busy + " busy / " + sum.runners),
    fact("finished", sum.finished_per_s === null ? "—" : short(sum.finished_per_s) + " /s"),
    fact("round trip p99", sum.roundtrip_p99_ms === null ? "—" : short(sum.roundtrip_p99_ms) + " ms")];
  ["queued", "dead_letters", "runners", "finished_per_s", "roundtrip_p99_ms"].forEach((name, i) => {
    facts[i].dataset.fig = name;
    facts[i].dataset.value = String(name === "runners" ? sum.runners : sum[name]);
  });
  return facts;
}

function ownCard(s) {
  const n = s.node;
  return el("div", { class: "card self", "data-node": n.id, "data-link": "self" },
    el("h3", {}, n.name || "?", " ", el("span", { class: "badge st-live" }, "this node")),
    el("div", { class: "mono muted" }, n.id.slice(0, 16) + "…"),
    fact("isolation", el("span", { class: "badge iso-" + (n.isolation || "unknown") }, n.isolation || "?")),
    ...summaryFacts(n.summary));
}

function peerCard(s, p) {
  // what only the peer knows (its queues, runners, counters) it tells in its summary, asked
  // over the link every few seconds: the newest one, its age, and why the last ask failed
  const sum = p.summary || {};
  const told = sum.told_at !== undefined;
  const own = told ? [...summaryFacts(sum), fact("told", ago(s.now, sum.told_at))] : [];
  if (sum.reason) own.push(el("p", { class: "muted note", "data-summary-reason": sum.reason },
    "its figures: " + sum.reason + (sum.detail ? " (" + sum.detail + ")" : "")));
  else if (!told) own.push(el("p", { class: "muted note" }, "its figures: not told yet"));
  return el("div", { class: "card link-" + p.link, "data-node": p.id, "data-link": p.link,
    "data-told": told ? "yes" : "no" },
    el("h3", {}, p.name || "-", " ", badge(p.link)),
    el("div", { class: "mono muted" }, p.id.slice(0, 16) + "…"),
    fact("since", ago(s.now, p.since)),
    p.link !== "up" ? null : fact("encryption", p.encryption ? p.encryption
      : el("span", { class: "badge iso-none" }, "NOT ENCRYPTED: " + p.plaintext)),
    fact("round trip", p.rtt_ms === null ? "—" : p.rtt_ms + " ms"),
    fact("outbox", p.outbox + (p.in_flight ? " (+" + p.in_flight + " unacked)" : "")),
    fact("breaker", el("span", { class: "badge br-" + p.breaker }, p.breaker.replace("_", "-")),
      p.failures ? " " + p.failures + " failed" : ""),
    fact("last seen", ago(s.now, p.last_seen)),
    p.error ? el("div", { class: "muted note" }, p.error) : null,
    ...own);
}

function drawGrid(s) {
  fill("grid", el("div", { class: "cards" }, ownCard(s), s.peers.map((p) => peerCard(s, p)),
    s.peers.length ? null : el("p", { class: "muted" }, "no peers configured")));
}

// -- charts: hand-drawn SVG polylines over the last minutes -----------------------------------

const POINTS_KEPT = 120;
const CW = 440, CH = 170, PAD = { l: 44, r: 8, t: 10, b: 22 };

function niceMax(value) {
  if (!(value > 0)) return 1;
  const step = Math.pow(10, Math.floor(Math.log10(value)));
  return [1, 2, 2.5, 5, 10].map((m) => m * step).find((m) => m >= value);
}

function short(value) {
  return value >= 1000 ? (value / 1000).toFixed(value >= 10000 ? 0 : 1) + "k"
    : String(Math.round(value * 100) / 100);
}

// lines: [{key, label, colour, values, dash}]; a null value is a gap (nothing was measured)
function since(seconds) {
  return "−" + (seconds < 120 ? Math.round(seconds) + " s" : Math.round(seconds / 60) + " min");
}

// the window: the last POINTS_KEPT samples once there are that many; until then, from the first
// sample on, so that a fresh node's chart is not a sliver at its right edge
// a log scale (latency: from 1 up, by powers of ten) or a linear one from 0
function scale(highest, log) {
  const h = CH - PAD.t - PAD.b;
  if (log) {
    const decades = Math.max(1, Math.ceil(Math.log10(Math.max(highest, 1))));
    return { ticks: [...Array(decades + 1).keys()].map((d) => Math.pow(10, d)),
      y: (v) => CH - PAD.b - h * Math.log10(Math.max(v, 1)) / decades };
  }
  const top = niceMax(highest);
  return { ticks: [0, top / 2, top], y: (v) => CH - PAD.b - h * (v / top) };
}

function chart(name, title, unit, at, now, every, lines, log) {
  const left = Math.max(now - every * POINTS_KEPT, at[0] - every), span = Math.max(now - left, every);
  const { ticks, y } = scale(Math.max(0, ...lines.flatMap((l) => l.values.filter((v) => v !== null))), log);
  const x = (t) => PAD.l + (CW - PAD.l - PAD.r) * Math.min(1, Math.max(0, (t - left) / span));
  const root = svg("svg", { viewBox: `0 0 ${CW} ${CH}`, class: "chart", "data-chart": name,
    role: "img", "aria-label": title });
  for (const tick of ticks) {
    root.append(svg("line", { class: "axis", x1: PAD.l, x2: CW - PAD.r, y1: y(tick), y2: y(tick) }));
    root.append(svg("text", { class: "tick", x: PAD.l - 4, y: y(tick) + 4, "text-anchor": "end" }, short(tick)));
  }
  [[left, since(span), "start"], [left + span / 2, since(span / 2), "middle"], [now, "now", "end"]].forEach(([t, label, anchor]) =>
    root.append(svg("text", { class: "tick", x: x(t), y: CH - 6, "text-anchor": anchor }, label)));
  for (const line of lines) {
    let run = [];
    const flush = () => {
      if (run.length === 1) {
        root.append(svg("circle", { cx: run[0][0], cy: run[0][1], r: 2.5, fill: line.colour, "data-series": line.key }));
      } else if (run.length > 1) {
        root.append(svg("polyline", { points: run.map((p) => p.join(",")).join(" "), stroke: line.colour,
          "stroke-dasharray": line.dash ? "4 3" : "none", class: "series", "data-series": line.key }));
      }
      run = [];
    };
    line.values.forEach((v, i) => {
      if (v === null || at[i] < left) { flush(); return; }
      run.push([x(at[i]).toFixed(1), y(v).toFixed(1)]);
    });
    flush();
  }
  const legend = el("div", { class: "legend" }, lines.map((l) => {
    const last = l.values.filter((v) => v !== null).pop();
    const swatch = el("i", { class: l.dash ? "dash" : "" });
    swatch.style.borderColor = l.colour;  // CSSOM, not a style attribute: the page's CSP allows it
    return el("span", { "data-series": l.key }, swatch, l.label + " ",
      el("b", {}, last === undefined ? "—" : short(last) + unit));
  }));
  return el("figure", { class: "chart-box" }, el("figcaption", {}, title), root, legend);
}

const DEPTH_COLOURS = ["#4a90d9", "#f5a623", "#8e6cc0", "#2e9d5b", "#d9443c", "#17a2b8", "#9aa0a6", "#c05a8e"];

function drawCharts(s) {
  const c = s.charts;
  if (!c || !c.at) { fill("charts", el("p", { class: "muted" }, "no samples yet")); return; }
  if (c.at.length < 1) {
    fill("charts", el("p", { class: "muted" }, `sampling every ${c.every_s} s: the first points come soon`));
    return;
  }
  const r = c.rates, l = c.latency_ms;
  const rates = [
    { key: "finished", label: "finished", colour: "#2e9d5b", values: r.finished },
    { key: "failed", label: "failed", colour: "#d9443c", values: r.failed },
    { key: "submitted", label: "submitted", colour: "#4a90d9", values: r.submitted },
    { key: "retried", label: "retried", colour: "#f5a623", values: r.retried, dash: true },
  ];
  const latency = [
    { key: "roundtrip_p50", label: "round trip p50", colour: "#4a90d9", values: l.roundtrip_p50 },
    { key: "roundtrip_p99", label: "round trip p99", colour: "#1d3f7a", values: l.roundtrip_p99 },
    { key: "run_p50", label: "run p50", colour: "#7cc49a", values: l.run_p50, dash: true },
    { key: "run_p99", label: "run p99", colour: "#2e7d4f", values: l.run_p99, dash: true },
  ];
  const busy = Object.entries(c.depths).filter(([, v]) => v.some((n) => n > 0));
  const depths = busy.length
    ? busy.map(([q, v], i) => ({ key: q, label: q, colour: DEPTH_COLOURS[i % DEPTH_COLOURS.length], values: v }))
    : [{ key: "all", label: "all queues empty", colour: "#9aa0a6",
      values: c.at.map(() => 0) }];
  fill("charts", el("div", { class: "charts" },
    chart("rates", "Jobs per second", "/s", c.at, s.now, c.every_s, rates),
    chart("latency", "Latency (ms, log scale)", " ms", c.at, s.now, c.every_s, latency, true),
    chart("depths", "Queue depths", "", c.at, s.now, c.every_s, depths)));
}

function levels(jobs) {
  const byId = Object.fromEntries(jobs.map((j) => [j.id, j]));
  const level = {};
  const depth = (id, seen) => {
    if (level[id] !== undefined) return level[id];
    if (seen.has(id)) return 0;
    seen.add(id);
    const deps = (byId[id] ? byId[id].depends : []).filter((d) => byId[d]);
    level[id] = deps.length ? 1 + Math.max(...deps.map((d) => depth(d, seen))) : 0;
    return level[id];
  };
  jobs.forEach((j) => depth(j.id, new Set()));
  return level;
}

function dag(flow) {
  const W = 150, H = 42, GX = 60, GY = 18;
  const level = levels(flow.jobs);
  const columns = [];
  for (const job of flow.jobs) (columns[level[job.id]] ||= []).push(job);
  const pos = {};
  columns.forEach((col, x) => col.forEach((job, y) => { pos[job.id] = [x * (W + GX), y * (H + GY)]; }));
  const rows = Math.max(...columns.map((c) => c.length));
  const root = svg("svg", { width: columns.length * (W + GX) - GX + 2, height: rows * (H + GY) - GY + 2,
    "data-flow": flow.id, role: "img", "aria-label": "flow " + flow.name });
  for (const job of flow.jobs) for (const dep of job.depends) {
    if (!pos[dep]) continue;
    const [x1, y1] = pos[dep], [x2, y2] = pos[job.id];
    root.append(svg("path", { class: "edge",
      d: `M${x1 + W + 1},${y1 + H / 2 + 1} C${x1 + W + GX / 2},${y1 + H / 2} ${x2 - GX / 2},${y2 + H / 2} ${x2 + 1},${y2 + H / 2 + 1}` }));
  }
  for (const job of flow.jobs) {
    const [x, y] = pos[job.id];
    const g = svg("g", { "data-job": job.id, "data-key": job.key, "data-status": job.status, "data-node": job.node,
      transform: `translate(${x + 1},${y + 1})` });
    g.append(svg("title", {}, `${job.id} on ${job.node}: ${job.status}` + (job.reason ? ` (${job.reason})` : "") + (job.stdout ? "\n" + job.stdout : "")));
    g.append(svg("rect", { width: W, height: H, rx: 6, fill: COLOURS[job.status] || "#666" }));
    g.append(svg("text", { x: 8, y: 17 }, job.id + " · " + job.node));
    g.append(svg("text", { x: 8, y: 33 }, job.status === "waiting_for_prerequisites" ? "waiting" : job.status));
    root.append(g);
  }
  return root;
}

function drawFlows(s) {
  fill("flows", s.flows.length ? s.flows.map((f) => el("div", { class: "flow", "data-flow": f.id, "data-context": f.context },
    el("h3", { "data-trace": "flow:" + f.id, title: "its timeline" }, (f.name || "flow") + " ", el("span", { class: "mono muted" }, f.id), " ", badge(f.status),
      f.reason ? el("span", { class: "muted" }, " " + f.reason) : null),
    dag(f))) : el("p", { class: "muted" }, "no flows yet"));
}

function drawJobs(s) {
  fill("jobs", table(["job", "type", "on", "status", "duration", "output", "submitted"],
    s.jobs.map((j) => el("tr", { "data-key": j.key, "data-status": j.status, "data-context": j.context },
      el("td", { class: "mono" }, j.key, j.context !== 1 ? " (ctx " + j.context + ")" : ""),
      el("td", {}, j.type), el("td", {}, j.node),
      el("td", {}, badge(j.status), j.attempt > 1 ? " attempt " + j.attempt : "",
        j.reason ? el("div", { class: "muted" }, j.reason) : null),
      el("td", {}, j.duration_s === null ? "—" : j.duration_s + " s"),
      el("td", {}, el("pre", {}, j.stdout + (j.stderr ? "\n" + j.stderr : "")),
        j.exit_code ? el("span", { class: "muted" }, "exit " + j.exit_code) : null),
      el("td", {}, ago(s.now, j.created_at))))));
}

function dlqRow(ctx, d) {
  const buttons = actions ? el("td", {},
    el("button", { "data-act": "retry", "data-ctx": ctx, "data-key": d.key }, "retry"), " ",
    el("button", { "data-act": "purge", "data-ctx": ctx, "data-key": d.key }, "purge")) : null;
  return el("tr", { "data-dlq": d.key }, el("td", { class: "mono" }, d.key),
    el("td", {}, badge("error"), " ", d.reason), el("td", {}, el("pre", {}, d.detail)),
    el("td", { class: "mono" }, d.queue), buttons);
}

function drawContexts(s) {
  fill("contexts", ...s.contexts.map((c) => el("div", { "data-context": c.id, "data-dlq-length": c.dlq.length },
    el("h3", {}, "context " + c.id),
    el("div", { class: "counters" }, Object.entries(c.queues).map(([q, n]) =>
      el("span", { class: "badge", "data-queue": q }, q + " " + n))),
    table(["runner", "type", "state"], c.runners.map((r) => el("tr", {},
      el("td", { class: "mono" }, r.id, r.local ? "" : " (external)"), el("td", {}, r.script_type),
      el("td", {}, badge(r.jobs.length ? "busy" : "idle"), " ", el("span", { class: "mono" }, r.jobs.join(", ")))))),
    el("h3", {}, `dead letters (${c.dlq.length})`,
      actions && c.dlq.length ? el("button", { "data-act": "purge", "data-ctx": c.id }, "purge all") : null),
    table(["key", "reason", "detail", "queue"].concat(actions ? [""] : []),
      c.dlq.entries.map((d) => dlqRow(c.id, d))))));
}

function drawMessages(s) {
  fill("messages", table(["message", "type", "to", "status", "delivery", "created"],
    s.messages.map((m) => el("tr", { "data-key": m.key },
      el("td", { class: "mono" }, m.key), el("td", {}, m.type), el("td", {}, m.to),
      el("td", {}, badge(m.status), m.reason ? el("div", { class: "muted" }, m.reason) : null),
      el("td", {}, m.delivery), el("td", {}, ago(s.now, m.created_at))))));
}

function draw(s) {
  actions = s.actions;
  document.getElementById("operator").hidden = !actions;
  drawGrid(s); drawGridCharts(s); drawCharts(s); drawNode(s); drawFlows(s); drawJobs(s); drawContexts(s); drawMessages(s);
  document.body.dataset.updated = String(s.now);
}

async function act(button) {
  document.getElementById("action-result").dataset.outcome = "pending";
  const token = document.getElementById("token").value;
  sessionStorage.setItem("hero-console-token", token);
  const body = { context: Number(button.dataset.ctx), key: button.dataset.key || null };
  const reply = await fetch("/api/dlq/" + button.dataset.act, {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + token },
    body: JSON.stringify(body),
  });
  const answer = await reply.json();
  const result = document.getElementById("action-result");
  result.textContent = answer.error || JSON.stringify(answer);
  result.dataset.outcome = reply.ok ? "done" : "refused";
}

function feedState(text, cls) {
  const b = document.getElementById("feed-state");
  b.textContent = text; b.className = "badge st-" + cls;
}

// The feed sends a snapshot only when something changed: between two, the page ages what it
// shows ("3 s ago") by its own clock, redrawing once a second.
let latest = null, receivedAt = 0;
setInterval(() => {
  if (latest) draw({ ...latest, now: latest.now + Math.floor((Date.now() - receivedAt) / 1000) });
}, 1000);

function connect() {
  const source = new EventSource("/api/events");
  source.addEventListener("state", (e) => {
    feedState("live", "live");
    latest = JSON.parse(e.data); receivedAt = Date.now();
    draw(latest);
  });
  source.addEventListener("trouble", (e) => feedState(JSON.parse(e.data), "trouble"));
  source.onerror = () => feedState("reconnecting…", "trouble");  // EventSource retries by itself
}

document.addEventListener("click", (e) => {
  const button = e.target.closest("button[data-act]");
  if (button) act(button);
});
document.getElementById("token").value = sessionStorage.getItem("hero-console-token") || "";
connect();
