// The coordinator's dashboard: polls /api/state every second and renders one view.
// Every string from the cluster goes in through textContent (app and container ids are chosen by
// applications, which are untrusted): no innerHTML anywhere.
"use strict";

let state = null;
let lastOk = 0;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

const cpu = (m) => +(m / 1000).toFixed(2) + " cpu";
const mem = (m) => (m >= 1024 ? (m / 1024).toFixed(1) + " GiB" : m + " MiB");
const res = (r) => cpu(r.cpu_millis) + ", " + mem(r.memory_mib);
const ms = (x) => (x >= 10000 ? (x / 1000).toFixed(1) + " s" : Math.round(x) + " ms");
const pct = (a, b) => (b > 0 ? Math.round((100 * a) / b) : 0);
const dur = (x) => (x % 3600000 === 0 ? x / 3600000 + " h" : x % 60000 === 0 ? x / 60000 + " min" : ms(x));

function card(label, value, id) {
  return el("div", { class: "card" }, el("div", { class: "label" }, label),
    el("div", { class: "value", id: id }, value));
}

function usageBar(capacity, g, q) {
  const gp = Math.min(100, pct(g, capacity));
  const qp = Math.min(100 - gp, pct(q, capacity));
  return el("span", { class: "bar", title: `GUARANTEED ${gp}%, QUEUEABLE ${qp}%` },
    el("span", { class: "g", style: `width:${gp}%` }), el("span", { class: "q", style: `width:${qp}%` }));
}

function table(headers, rows, attrs) {
  return el("table", attrs || {},
    el("thead", {}, el("tr", {}, headers.map((h) =>
      el("th", { class: h.endsWith("#") ? "num" : "" }, h.replace(/#$/, ""))))),
    el("tbody", {}, rows.length ? rows
      : el("tr", {}, el("td", { class: "muted", colspan: String(headers.length) }, "none"))));
}

function bookingsByNode() {
  const m = new Map();
  for (const b of state.guarantor.bookings) m.set(b.node_id, b);
  return m;
}

// As `coordinator nodes` says it: a draining node takes no new work; once nothing runs there it
// is drained and its worker can be stopped.
function nodeState(n) {
  if (n.drained) return "drained";
  return n.draining ? "draining" : "ready";
}

function viewCluster() {
  const c = state.cluster;
  const g = state.guarantor;
  const cap = c.nodes.reduce((a, n) => a + n.capacity.cpu_millis, 0);
  const booked = g.bookings.reduce((a, b) => a + b.guaranteed_booked.cpu_millis, 0);
  const qRun = c.nodes.reduce((a, n) => a + n.queueable_running.cpu_millis, 0);
  const queued = c.nodes.reduce((a, n) => a + n.queued, 0);
  const running = c.nodes.reduce((a, n) => a + n.running_guaranteed + n.running_queueable, 0);
  const books = bookingsByNode();
  const rows = c.nodes.map((n) => {
    const b = books.get(n.node_id);
    const gBooked = b ? b.guaranteed_booked.cpu_millis : 0;
    return el("tr", { "data-node": n.node_id },
      el("td", {}, el("a", { href: "#node/" + encodeURIComponent(n.node_id) }, n.node_id)),
      el("td", {}, n.rack),
      el("td", {}, res(n.capacity)),
      el("td", {}, usageBar(n.capacity.cpu_millis, gBooked, n.queueable_running.cpu_millis)),
      el("td", { class: "num" }, cpu(gBooked)),
      el("td", { class: "num", "data-field": "running" }, n.running_guaranteed + " G / " + n.running_queueable + " Q"),
      el("td", { class: "num", "data-field": "queued" }, n.queued),
      el("td", { class: "num", title: `Tq ${ms(n.queue_delay.tq_ms)}, Tr ${ms(n.queue_delay.tr_ms)}, Tl ${ms(n.queue_delay.tl_ms)}` },
        ms(n.queue_delay_ms)),
      el("td", { class: "num" }, b ? cpu(b.queueable_limit.cpu_millis) : "–"),
      el("td", { class: "num" }, ms(n.silent_ms)),
      el("td", { "data-field": "state" }, nodeState(n)));
  });
  return [
    el("div", { class: "cards" },
      card("nodes joined", c.nodes.length, "nodes-joined"),
      card("nodes lost", c.lost_nodes.length, "nodes-lost"),
      card("GUARANTEED booked", pct(booked, cap) + "% of " + cpu(cap), "guaranteed-booked"),
      card("QUEUEABLE running", cpu(qRun), "queueable-running"),
      card("containers running", running, "containers-running"),
      card("queued", queued, "containers-queued"),
      card("waiting GUARANTEED", g.pending_containers, "waiting-guaranteed"),
      card("shedding threshold", c.shedding_threshold_ms === null ? "off" : ms(c.shedding_threshold_ms), "shedding-threshold")),
    el("p", { class: "legend muted" }, "CPU use:", el("span", { style: "background:var(--g)" }), "GUARANTEED booked",
      el("span", { style: "background:var(--q)" }), "QUEUEABLE running", el("span", { style: "background:var(--free)" }), "free",
      ` · top-k ${c.top_k} · placer ${g.placer}`),
    table(["node", "rack", "capacity", "CPU", "G booked#", "running#", "queued#", "R = Tq+Tr+Tl#", "Q limit#", "last heard#", "state"],
      rows, { id: "nodes" }),
    c.lost_nodes.length ? el("p", { class: "muted" }, "Lost: " + c.lost_nodes.join(", ")) : null,
  ];
}

function viewNode(id) {
  const n = state.cluster.nodes.find((x) => x.node_id === id);
  if (!n) return [el("p", {}, "No joined node named ", el("code", {}, id), ".")];
  const b = bookingsByNode().get(id);
  const rows = n.containers.map((c) => el("tr", { "data-container": c.id },
    el("td", {}, c.id), el("td", {}, c.app_id), el("td", {}, c.container_type),
    el("td", {}, c.state), el("td", {}, res(c.resources))));
  return [
    el("h2", { id: "node-title" }, "Node " + n.node_id),
    el("div", { class: "cards" },
      card("capacity", res(n.capacity)),
      card("GUARANTEED booked", b ? res(b.guaranteed_booked) : "–"),
      card("QUEUEABLE limit", b ? res(b.queueable_limit) : "–"),
      card("R = Tq + Tr + Tl", ms(n.queue_delay_ms)),
      card("Tq / Tr / Tl", [n.queue_delay.tq_ms, n.queue_delay.tr_ms, n.queue_delay.tl_ms].map(ms).join(" / ")),
      card("queued", n.queued, "node-queued")),
    el("h2", {}, "Containers (running first, then the queue in order)"),
    table(["container", "app", "type", "state", "resources"], rows, { id: "node-containers" }),
    n.containers_total > n.containers.length
      ? el("p", { class: "muted" }, `${n.containers.length} of ${n.containers_total} shown.`) : null,
  ];
}

function quota(q) {
  const parts = [];
  if (q.max_queueable !== null && q.max_queueable !== undefined) parts.push("≤ " + q.max_queueable + " QUEUEABLE");
  if (q.max_queueable_per_guaranteed !== null && q.max_queueable_per_guaranteed !== undefined) parts.push("≤ " + q.max_queueable_per_guaranteed + " Q per G");
  return parts.length ? parts.join(", ") : "unlimited";
}

function viewApps() {
  const rows = state.cluster.apps.map((a) => el("tr", { "data-app": a.app_id },
    el("td", {}, a.app_id), el("td", {}, quota(a.quota)),
    el("td", { class: "num" }, a.running_guaranteed), el("td", { class: "num" }, a.running_queueable),
    el("td", { class: "num" }, a.queued)));
  return [el("h2", {}, "Applications"),
    table(["app", "QUEUEABLE quota", "GUARANTEED running#", "QUEUEABLE running#", "queued#"], rows, { id: "apps" })];
}

function viewWaiting() {
  const g = state.guarantor;
  const rows = g.waiting.map((w) => el("tr", {},
    el("td", {}, w.app_id), el("td", {}, w.job_id), el("td", { class: "num" }, w.containers),
    el("td", {}, res(w.resources)), el("td", {}, w.reservation || "–"), el("td", { class: "reason" }, w.reason)));
  return [el("h2", {}, `Waiting GUARANTEED asks: ${g.pending_asks} (${g.pending_containers} containers)`),
    table(["app", "job", "containers#", "each", "reservation", "why it waits"], rows, { id: "waiting" }),
    g.pending_asks > g.waiting.length ? el("p", { class: "muted" }, `First ${g.waiting.length} shown.`) : null];
}

function ratioPct(x) {
  return x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)} %`;
}

// 3Sigma (issue 13/18): SLO attainment of finished jobs, the last cycle, and the waiting jobs
// with their explain data (runtime distribution, best options, why not placed).
function viewThreeSigma() {
  const t = state.guarantor.threesigma;
  if (!t) return [el("h2", {}, "3Sigma"), el("p", { class: "muted" }, "3Sigma scheduling is off on this coordinator.")];
  const a = t.attainment;
  const cards = el("div", { class: "cards" },
    card("SLO attainment", ratioPct(a.attainment), "slo-attainment"),
    card("SLO met", a.slo_met, "slo-met"),
    card("SLO missed", a.slo_missed, "slo-missed"),
    card("best effort finished", a.best_effort_finished, "be-finished"),
    card("waiting jobs", t.pending_jobs, "threesigma-pending"));
  const perApp = Object.entries(a.per_app).map(([app, p]) => el("tr", {},
    el("td", {}, app), el("td", { class: "num" }, p.slo_met), el("td", { class: "num" }, p.slo_missed),
    el("td", { class: "num" }, ratioPct(p.attainment)), el("td", { class: "num" }, p.best_effort_finished)));
  const c = t.last_cycle;
  const cycle = c ? el("p", { class: "muted" },
    `Last cycle: ${c.method}, ${c.pending} jobs, MILP ${c.columns} columns × ${c.rows} rows, objective ${c.objective.toFixed(3)}` +
    (c.lp_bound ? ` of bound ${c.lp_bound.toFixed(3)}` : "")) : el("p", { class: "muted" }, "No cycle yet.");
  const jobs = t.waiting_jobs.map((j) => el("tr", {},
    el("td", {}, j.app_id), el("td", {}, j.job_id), el("td", { class: "num" }, j.gang),
    el("td", {}, `${j.belief.p10_s.toFixed(1)} / ${j.belief.p50_s.toFixed(1)} / ${j.belief.p90_s.toFixed(1)} s`),
    el("td", {}, j.options.slice(0, 3).map((o) => `+${o.start_in_s.toFixed(0)} s: ${o.expected_utility.toFixed(2)}${o.chosen ? " (chosen)" : ""}`).join(", ") || "–"),
    el("td", { class: "reason" }, j.reason)));
  return [el("h2", {}, "3Sigma: SLO attainment"), cards,
    table(["app", "SLO met#", "SLO missed#", "attainment", "best effort#"], perApp, { id: "slo-per-app" }),
    el("h2", {}, `Waiting 3Sigma jobs: ${t.pending_jobs}`), cycle,
    table(["app", "job", "containers#", "runtime p10 / p50 / p90", "best options (start: expected utility)", "why not placed"], jobs, { id: "threesigma-waiting" })];
}

const palette = ["#3566c9", "#2a9d8f", "#8e5cc4", "#e76f51", "#6a994e", "#bc4749", "#277da1", "#f4a261"];

// The agenda over one horizon as a stacked step chart of CPU: each reservation's allocation,
// the plan's capacity on top, and a line at now.
function agendaChart(g) {
  const W = 960, H = 260, L = 60, B = 24, T = 10;
  const horizon = g.agenda_horizon_ms || 1;
  const capacity = Math.max(g.plan_capacity.cpu_millis, 1);
  const s = svg("svg", { width: W, height: H, class: "chart", id: "agenda", viewBox: `0 0 ${W} ${H}` });
  const x = (t) => L + ((W - L - 10) * t) / horizon;
  const y = (v) => H - B - ((H - B - T) * v) / capacity;
  const cuts = new Set([0, horizon]);
  for (const r of g.reservations) for (const a of r.allocation) { cuts.add(a.start_ms); cuts.add(a.end_ms); }
  const points = [...cuts].filter((t) => t >= 0 && t <= horizon).sort((a, b) => a - b);
  for (let i = 0; i + 1 < points.length; i++) {
    const [t0, t1] = [points[i], points[i + 1]];
    let base = 0;
    g.reservations.forEach((r, k) => {
      const a = r.allocation.find((a) => a.start_ms <= t0 && t0 < a.end_ms);
      if (!a || a.cpu_millis === 0) return;
      const rect = svg("rect", { x: x(t0), y: y(base + a.cpu_millis), width: Math.max(x(t1) - x(t0), 0.5),
        height: y(base) - y(base + a.cpu_millis), fill: palette[k % palette.length] });
      const title = svg("title", {});
      title.textContent = `${r.id} (${r.owner}): ${cpu(a.cpu_millis)}`;
      rect.append(title);
      s.append(rect);
      base += a.cpu_millis;
    });
  }
  s.append(svg("line", { x1: L, x2: W - 10, y1: y(capacity), y2: y(capacity), stroke: "#1d2330", "stroke-dasharray": "4 3" }));
  s.append(svg("line", { x1: x(g.agenda_now_ms), x2: x(g.agenda_now_ms), y1: T, y2: H - B, stroke: "#c0392b" }));
  const label = (tx, ty, text, anchor) => {
    const t = svg("text", { x: tx, y: ty, "font-size": 11, "text-anchor": anchor || "start", fill: "#6b7280" });
    t.textContent = text;
    s.append(t);
  };
  label(L - 4, y(capacity) + 4, cpu(capacity), "end");
  label(L - 4, y(0), "0", "end");
  for (let k = 0; k <= 4; k++) label(x((horizon * k) / 4), H - 6, dur(Math.round((horizon * k) / 4)), "middle");
  label(x(g.agenda_now_ms) + 4, T + 10, "now");
  return s;
}

function viewReservations() {
  const g = state.guarantor;
  const rows = g.reservations.map((r, k) => el("tr", { "data-reservation": r.id },
    el("td", {}, el("span", { class: "bar", style: `width:10px;background:${palette[k % palette.length]}` }), " ", r.id),
    el("td", {}, r.owner),
    el("td", {}, dur(r.definition.arrival_ms) + " → " + dur(r.definition.deadline_ms)),
    el("td", {}, r.definition.recurrence_ms ? "every " + dur(r.definition.recurrence_ms) : "once"),
    el("td", {}, res(r.allocated_now)), el("td", {}, res(r.used))));
  return [
    el("h2", {}, `Reservation agenda (one horizon of ${dur(g.agenda_horizon_ms)}, step ${dur(g.agenda_step_ms)}): ${g.reservations_total} reservations`),
    agendaChart(g),
    table(["reservation", "owner", "window", "recurrence", "allocated now", "used now"], rows, { id: "reservations" }),
    g.reservations_total > g.reservations.length ? el("p", { class: "muted" }, `First ${g.reservations.length} shown.`) : null,
  ];
}

function render() {
  if (!state) return;
  const hash = decodeURIComponent(location.hash.slice(1)) || "cluster";
  const [view, arg] = hash.split(/\/(.*)/s);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === view);
  const views = { cluster: viewCluster, apps: viewApps, waiting: viewWaiting, reservations: viewReservations,
    threesigma: viewThreeSigma,
    node: () => viewNode(arg || "") };
  const main = document.getElementById("main");
  main.replaceChildren(...[].concat((views[view] || viewCluster)()).filter((x) => x));
  main.dataset.takenAt = state.cluster.taken_at_ms;
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const r = await fetch("/api/state", { cache: "no-store" });
    if (!r.ok) throw new Error("HTTP " + r.status);
    state = await r.json();
    lastOk = Date.now();
    status.textContent = "live · " + new Date(lastOk).toLocaleTimeString();
    status.classList.remove("stale");
    render();
  } catch (e) {
    status.textContent = "no answer from the coordinator (" + e.message + ")";
    status.classList.add("stale");
  }
}

window.addEventListener("hashchange", render);
poll();
setInterval(poll, 1000);
