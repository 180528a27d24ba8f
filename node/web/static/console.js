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

function drawPeers(s) {
  fill("peers", table(["peer", "link", "last seen", "round trip", "outbox", "sent, unacked"],
    s.peers.map((p) => el("tr", { "data-peer": p.id },
      el("td", {}, p.name || "-", el("div", { class: "mono muted" }, p.id.slice(0, 16) + "…")),
      el("td", {}, badge(p.link), " ", el("span", { class: "muted" }, "since " + ago(s.now, p.since)),
        p.link !== "up" ? "" : p.encryption ? el("div", { class: "muted" }, p.encryption) : el("div", { class: "badge iso-none" }, "NOT ENCRYPTED: " + p.plaintext)),
      el("td", {}, ago(s.now, p.last_seen)),
      el("td", {}, p.rtt_ms === null ? "—" : p.rtt_ms + " ms"),
      el("td", {}, p.outbox), el("td", {}, p.in_flight)))));
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
    const g = svg("g", { "data-job": job.id, "data-key": job.key, "data-status": job.status,
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
  fill("flows", s.flows.length ? s.flows.map((f) => el("div", { class: "flow", "data-flow": f.id },
    el("h3", {}, (f.name || "flow") + " ", el("span", { class: "mono muted" }, f.id), " ", badge(f.status),
      f.reason ? el("span", { class: "muted" }, " " + f.reason) : null),
    dag(f))) : el("p", { class: "muted" }, "no flows yet"));
}

function drawJobs(s) {
  fill("jobs", table(["job", "type", "on", "status", "duration", "output", "submitted"],
    s.jobs.map((j) => el("tr", { "data-key": j.key, "data-status": j.status },
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
  drawNode(s); drawPeers(s); drawFlows(s); drawJobs(s); drawContexts(s); drawMessages(s);
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
