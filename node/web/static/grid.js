// hero-node console, the grid: charts per node and for the whole grid, and one job's, message's
// or flow's hop timeline (/api/trace: the document of `hero-node job trace --json`).
// Uses console.js's helpers (el, svg, chart, fill, badge, short); every string is text.
"use strict";

const NODE_COLOURS = ["#4a90d9", "#f5a623", "#8e6cc0", "#2e9d5b", "#d9443c", "#17a2b8", "#c05a8e"];
const GRID_COLOUR = "#222";

// a node's column, aligned at its newest end to `points` (what the grid's sums do too)
function alignEnd(values, points) {
  const v = (values || []).slice(-points);
  return Array(points - v.length).fill(null).concat(v);
}

function total(depths, points) {
  const columns = Object.values(depths || {}).map((c) => alignEnd(c, points));
  return [...Array(points).keys()].map((i) => {
    const vs = columns.map((c) => c[i]).filter((v) => v !== null);
    return vs.length ? vs.reduce((a, b) => a + b, 0) : null;
  });
}

function gridNodes(s) {
  const nodes = [{ id: s.node.id, name: s.node.name, charts: s.charts }];
  for (const p of s.peers) {
    if (p.summary && p.summary.charts && p.summary.charts.at) {
      nodes.push({ id: p.id, name: p.name || p.id.slice(0, 12), charts: p.summary.charts });
    }
  }
  return nodes;
}

function drawGridCharts(s) {
  const g = s.grid && s.grid.charts;
  if (!g || !g.at || !g.at.length) {
    fill("grid-charts", el("p", { class: "muted" }, "no samples yet: the first points come soon"));
    return;
  }
  const n = g.at.length, nodes = gridNodes(s);
  const per = (pick) => nodes.map((node, i) => ({ key: "node-" + node.id.slice(0, 16),
    label: node.name, colour: NODE_COLOURS[i % NODE_COLOURS.length], values: alignEnd(pick(node.charts), n) }));
  const grid = (values, label) => ({ key: "grid", label, colour: GRID_COLOUR, values, dash: true });
  const rates = per((c) => c.rates.finished).concat([grid(g.rates.finished, "grid")]);
  const p50 = per((c) => c.latency_ms.roundtrip_p50).map((l) => ({ ...l, dash: true, key: l.key + "-p50",
    label: l.label + " p50" }));
  const p99 = per((c) => c.latency_ms.roundtrip_p99).map((l) => ({ ...l, key: l.key + "-p99",
    label: l.label + " p99" }));
  const depths = per((c) => total(c.depths, c.at.length)).concat([grid(total(g.depths, n), "grid")]);
  fill("grid-charts", el("div", { class: "charts" },
    chart("grid-rates", "Jobs finished per second", "/s", g.at, s.now, g.every_s, rates),
    chart("grid-latency", "Round trip p50 / p99 (ms, log scale)", " ms", g.at, s.now, g.every_s,
      p50.concat(p99, [grid(g.latency_ms.roundtrip_p99, "grid p99 (worst node)")]), true),
    chart("grid-depths", "Queued (all lists)", "", g.at, s.now, g.every_s, depths)));
}

// -- one job's (message's, flow's) hops on a time line ----------------------------------------

const HOP_COLOURS = { finished: "#2e9d5b", error: "#d9443c", retry: "#f5a623" };

function clock(at) {
  return new Date(at * 1000).toISOString().slice(11, 23);
}

function hopsSvg(job, from, span, names) {
  const W = 900, H = 26, L = 4;
  const x = (t) => L + (W - 2 * L) * (t - from) / span;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "hops", "data-timeline-job": job.key });
  root.append(svg("line", { class: "axis", x1: L, x2: W - L, y1: H / 2, y2: H / 2 }));
  job.hops.forEach((hop, i) => {
    const attrs = { "data-hop": i, "data-what": hop.what, "data-node": hop.node,
      "data-attempt": hop.attempt === null ? "" : hop.attempt, "data-outcome": hop.outcome };
    const g = svg("g", attrs);
    g.append(svg("title", {}, `${hop.what} on ${names(hop.node)} at ${clock(hop.at)}` +
      (hop.attempt ? ` (attempt ${hop.attempt})` : "") + (hop.outcome ? `: ${hop.outcome}` : "") +
      (hop.detail ? ` ${hop.detail}` : "")));
    if (hop.what === "attempt") {
      const w = Math.max(3, x(hop.at + (hop.duration_s || 0)) - x(hop.at));
      g.append(svg("rect", { x: x(hop.at), y: 4, width: w, height: H - 8, rx: 3,
        fill: HOP_COLOURS[hop.outcome] || "#4a90d9" }));
    } else {
      g.append(svg("circle", { cx: x(hop.at), cy: H / 2, r: 4, fill: "#555" }));
    }
    root.append(g);
  });
  return root;
}

function drawTimeline(doc) {
  const names = (id) => (doc.nodes[id] && doc.nodes[id].name) || (id ? id.slice(0, 12) : "?");
  const hops = doc.jobs.flatMap((j) => j.hops);
  const from = Math.min(...hops.map((h) => h.at));
  const to = Math.max(...hops.map((h) => h.at + (h.what === "attempt" ? h.duration_s || 0 : 0)));
  const span = Math.max(to - from, 0.001);
  const missing = Object.entries(doc.nodes).filter(([, n]) => !n.told).map(([id, n]) =>
    el("p", { class: "muted note", "data-untold": id }, names(id) + " did not tell its part: " + n.reason +
      (n.detail ? " (" + n.detail + ")" : "")));
  const head = doc.flow ? el("p", { "data-timeline-flow": doc.flow.id }, "flow " + doc.flow.id + " ",
    doc.flow.name, " ", badge(doc.flow.status)) : null;
  const jobs = doc.jobs.map((j) => el("div", { class: "timeline-job", "data-key": j.key, "data-node": j.node,
    "data-attempts": j.attempts },
    el("h3", {}, j.flow_job ? j.flow_job + " " : "", el("span", { class: "mono" }, j.key), " on ",
      el("b", {}, names(j.node)), " ", badge(j.status), " ",
      j.attempts + " attempt" + (j.attempts === 1 ? "" : "s"), j.reason ? " · " + j.reason : ""),
    hopsSvg(j, from, span, names),
    table(["node", "time", "hop", "attempt", "outcome", "took"], j.hops.map((h) => el("tr", {},
      el("td", {}, names(h.node)), el("td", { class: "mono" }, clock(h.at)), el("td", {}, h.what),
      el("td", {}, h.attempt === null ? "" : h.attempt), el("td", {}, h.outcome, h.detail ? " " + (/^[0-9a-f]{64}$/.test(h.detail) ? names(h.detail) : h.detail) : ""),
      el("td", {}, h.duration_s === null ? "—" : short(h.duration_s) + " s"))))));
  fill("timeline", head, missing, jobs);
}

async function showTimeline(ctx, key) {
  const section = document.getElementById("timeline");
  section.hidden = false;
  section.dataset.state = "loading";
  document.getElementById("timeline-key").textContent = key;
  const reply = await fetch("/api/trace?context=" + encodeURIComponent(ctx) + "&key=" + encodeURIComponent(key));
  const doc = await reply.json();
  if (!reply.ok) {
    fill("timeline", el("p", { class: "muted" }, doc.error || "no timeline"));
    section.dataset.state = "refused";
    return;
  }
  drawTimeline(doc);
  section.dataset.key = doc.key;
  section.dataset.state = "drawn";
}

// a job in the recent jobs' table or in a flow's DAG opens its timeline; so does #trace=KEY
document.addEventListener("click", (e) => {
  const target = e.target.closest("#jobs tr[data-key], #flows g[data-key], #flows h3[data-trace]");
  if (!target) return;
  const key = target.dataset.key || target.dataset.trace;
  const ctx = target.closest("[data-context]") ? target.closest("[data-context]").dataset.context : 1;
  location.hash = "trace=" + encodeURIComponent(key) + "&context=" + ctx;
});

function fromHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("trace")) showTimeline(params.get("context") || "1", params.get("trace"));
}
window.addEventListener("hashchange", fromHash);
fromHash();
