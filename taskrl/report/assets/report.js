// taskrl report: renders the embedded JSON payload (see taskrl/report/data.py) into charts, tables and the
// trajectory viewer. Plain DOM + SVG, no library, no network. Model text is always set as textContent.
"use strict";
window.__reportErrors = [];
window.addEventListener("error", (e) => window.__reportErrors.push(String(e.message)));

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const SVG_NS = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick") node.addEventListener("click", v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fmt(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (typeof v !== "number") return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
  if (a >= 100) return v.toFixed(0);
  return String(Number(v.toPrecision(digits)));
}
const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(0)}%`);

function ticks(lo, hi, n) {
  if (lo === hi) return [lo];
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / n)));
  const mult = [1, 2, 5, 10].find((m) => (hi - lo) / (step * m) <= n) || 10;
  const s = step * mult;
  const out = [];
  for (let t = Math.ceil(lo / s) * s; t <= hi + s * 1e-9; t += s) out.push(Number(t.toPrecision(12)));
  return out;
}

// A small line chart: xs/ys (nulls skipped), optional threshold line and alert markers.
function lineChart({ title, xs, ys, threshold, alertXs, note }) {
  const W = 320, H = 150, L = 44, R = 8, T = 8, B = 22;
  const pts = xs.map((x, i) => [x, ys[i]]).filter(([x, y]) => x !== null && y !== null && Number.isFinite(y));
  const card = el("div", { class: "chart-card" + (alertXs && alertXs.length ? " alerting" : "") },
    el("div", { class: "chart-title", title: title }, title, note ? el("span", { class: "muted" }, ` ${note}`) : null));
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, "data-metric": title });
  card.append(root);
  if (!pts.length) { root.append(svg("text", { x: L, y: H / 2, class: "muted" }, "no values")); return card; }
  let [x0, x1] = [Math.min(...pts.map((p) => p[0])), Math.max(...pts.map((p) => p[0]))];
  const yv = pts.map((p) => p[1]).concat(threshold !== undefined && threshold !== null ? [threshold] : []);
  let [y0, y1] = [Math.min(...yv), Math.max(...yv)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
  const pad = (y1 - y0) * 0.06; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const axis = svg("g", { class: "axis" });
  for (const t of ticks(y0, y1, 4)) {
    axis.append(svg("line", { x1: L, x2: W - R, y1: sy(t), y2: sy(t), class: "grid-line" }));
    axis.append(svg("text", { x: L - 4, y: sy(t) + 3, "text-anchor": "end" }, fmt(t)));
  }
  for (const t of ticks(x0, x1, 5).filter((t) => Number.isInteger(t) || x1 - x0 < 5)) {
    axis.append(svg("text", { x: sx(t), y: H - 6, "text-anchor": "middle" }, fmt(t)));
  }
  root.append(axis);
  if (threshold !== undefined && threshold !== null) {
    root.append(svg("line", { class: "threshold", x1: L, x2: W - R, y1: sy(threshold), y2: sy(threshold) }));
  }
  const d = pts.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
  root.append(svg("path", { class: "line", d }));
  if (pts.length <= 200) {
    for (const [x, y] of pts) {
      const dot = svg("circle", { class: "dot", cx: sx(x), cy: sy(y), r: pts.length === 1 ? 3.5 : 2 });
      dot.append(svg("title", {}, `step ${x}: ${fmt(y, 4)}`));
      root.append(dot);
    }
  }
  const alertSet = new Set(alertXs || []);
  for (const [x, y] of pts.filter(([x]) => alertSet.has(x))) {
    const mark = svg("circle", { class: "alert", cx: sx(x), cy: sy(y), r: 4 });
    mark.append(svg("title", {}, `alert at step ${x}: ${fmt(y, 4)}`));
    root.append(mark);
  }
  return card;
}

function table(headers, rows, opts = {}) {
  const numeric = opts.numeric || [];
  return el("table", { class: opts.cls || "" },
    el("thead", {}, el("tr", {}, headers.map((h, i) => el("th", { class: numeric.includes(i) ? "num" : null }, h)))),
    el("tbody", {}, rows.map((r) => el("tr", { class: r.cls || null, onclick: r.onclick || null, "data-key": r.key || null },
      r.cells.map((c, i) => el("td", { class: numeric.includes(i) ? "num" : null }, c))))));
}

// ---- header and metrics -------------------------------------------------------------------------------------

function renderHeader() {
  const alerts = DATA.alerts.length;
  document.title = `taskrl report: ${DATA.title}`;
  document.getElementById("title").textContent = `taskrl report: ${DATA.title}`;
  const chips = document.getElementById("chips");
  chips.append(el("span", { class: "chip" }, `${DATA.metrics.steps.length} logged steps`),
    el("span", { class: "chip" }, `${DATA.episodes} episodes`),
    el("span", { class: "chip" + (alerts ? " bad" : "") }, `${alerts} alerts`),
    el("span", { class: "chip muted" }, `${DATA.source} · ${DATA.generated}`));
}

function renderMetrics() {
  const box = document.getElementById("metrics-body");
  const { steps, series } = DATA.metrics;
  const groups = {};
  for (const name of Object.keys(series)) {
    if (name.includes("monitor/")) continue;
    const ns = name.includes("/") ? name.split("/")[0] : "other";
    (groups[ns] = groups[ns] || []).push(name);
  }
  if (!Object.keys(groups).length) box.append(el("p", { class: "muted" }, "This run logged no metrics."));
  for (const ns of Object.keys(groups).sort()) {
    box.append(el("h3", {}, ns));
    box.append(el("div", { class: "grid" }, groups[ns].map((n) => lineChart({ title: n, xs: steps, ys: series[n] }))));
  }
}

function renderMonitors() {
  const box = document.getElementById("monitors-body");
  const { steps, series } = DATA.metrics;
  const names = Object.keys(series).filter((n) => n.includes("monitor/"));
  if (DATA.monitors.source === "report") {
    box.append(el("p", { class: "muted" }, "The run logged no monitors; these were computed by the report from its trajectories."));
  }
  box.append(el("div", { class: "grid" }, names.map((n) => {
    const base = n.split("monitor/")[1];
    const th = DATA.monitors.thresholds[base] || {};
    const prefix = n.split("monitor/")[0];
    const note = th.threshold !== undefined ? `(${th.above ? "max" : "min"} ${fmt(th.threshold)})` : "";
    return lineChart({ title: n, xs: steps, ys: series[n], threshold: th.threshold, note,
      alertXs: DATA.alerts.filter((a) => a.monitor === prefix + base).map((a) => a.step) });
  })));
  box.append(el("h3", {}, `Alerts (${DATA.alerts.length})`));
  if (!DATA.alerts.length) { box.append(el("p", { class: "muted" }, "No monitor crossed its threshold.")); return; }
  box.append(table(["step", "monitor", "value", "threshold", "message"],
    DATA.alerts.map((a) => ({ cls: "alert-row", cells: [a.step, a.monitor, fmt(a.value), fmt(a.threshold), a.message] })),
    { numeric: [0, 2, 3] }));
}

// ---- evaluations --------------------------------------------------------------------------------------------

function withCI(e, percent) {
  if (!e || e.value === null || e.value === undefined) return "–";
  const f = percent ? pct : (v) => fmt(v);
  return e.low === null || e.low === undefined ? f(e.value) : `${f(e.value)} [${f(e.low)}, ${f(e.high)}]`;
}

function renderEvals() {
  const box = document.getElementById("evals-body");
  if (!DATA.evals.length) { box.append(el("p", { class: "muted" }, "No evaluation in this run.")); return; }
  for (const ev of DATA.evals) {
    const ks = (ev.config && ev.config.pass_ks) || [];
    box.append(el("h3", {}, `${ev.name}: env ${ev.env || "?"}, ${ev.tasks} tasks × ${ev.samples_per_task} samples` +
      (ev.step ? ` (step ${ev.step})` : "")));
    box.append(el("p", { class: "muted" }, `95% CI: ${ev.ci_method}; pass = reward ≥ ${ev.success_threshold}`));
    const names = Object.keys(ev.policies);
    const headers = ["policy", "episodes", "mean reward", "success", ...ks.map((k) => `pass@${k}`), "tool calls", "Δ reward vs first", "alerts"];
    box.append(table(headers, names.map((n) => {
      const p = ev.policies[n];
      const delta = Object.keys(p).find((k) => k.startsWith("delta_mean_reward_vs_"));
      return { cells: [n, p.episodes, withCI(p.mean_reward), withCI(p.success_rate, true),
        ...ks.map((k) => withCI(p[`pass@${k}`], true)), fmt(p.tool_calls), delta ? withCI(p[delta]) : "–",
        (p.alerts || []).map((a) => a.monitor).join(", ") || "–"] };
    }), { numeric: [1, 2, 3, ...ks.map((_, i) => 4 + i), 4 + ks.length, 5 + ks.length] }));
    const perTask = el("details", {}, el("summary", {}, `per-task table (${ev.per_task.length} tasks)`),
      table(["task", ...names.flatMap((n) => [`${n}: mean reward`, `${n}: passes`])],
        ev.per_task.map((row) => ({ cells: [row.task_id, ...names.flatMap((n) => {
          const r = row.policies[n] || {};
          return [fmt(r.mean_reward), `${r.successes ?? "–"}/${r.n ?? "–"}`];
        })] })), { numeric: names.flatMap((_, i) => [1 + 2 * i, 2 + 2 * i]) }));
    box.append(perTask);
  }
}

// ---- trajectories -------------------------------------------------------------------------------------------

function ending(t) {
  if (t.error) return "error";
  if (t.truncated) return `cut (${(t.info && t.info.truncation) || "budget"})`;
  return t.terminated ? "done" : "–";
}

function renderTrajectoryList() {
  const box = document.getElementById("trajectories-body");
  if (!DATA.trajectories.length) { box.append(el("p", { class: "muted" }, "No trajectories in this run.")); return; }
  const sources = [...new Set(DATA.trajectories.map((t) => t.source))];
  const filter = el("input", { type: "search", placeholder: "filter by task, text, tool…", id: "traj-filter" });
  const source = el("select", { id: "traj-source" }, el("option", { value: "" }, "all sources"),
    sources.map((s) => el("option", { value: s }, s)));
  const list = el("div", { class: "traj-list", id: "traj-list" });
  const detail = el("div", { id: "traj-detail", class: "empty" }, "Click a trajectory to open it.");
  box.append(el("div", { class: "filters" }, filter, source,
    el("span", { class: "muted" }, `${DATA.trajectories.length} shown`)), el("div", { class: "traj-layout" }, list, detail));
  const draw = () => {
    const q = filter.value.toLowerCase();
    const rows = DATA.trajectories.filter((t) => (!source.value || t.source === source.value) &&
      (!q || JSON.stringify([t.task_id, t.messages]).toLowerCase().includes(q)));
    list.replaceChildren(table(["step", "source", "task", "reward", "turns", "calls", "tokens", "end"],
      rows.map((t) => ({ key: t.key, cls: "traj-row", onclick: () => openTrajectory(t.key),
        cells: [t.step, t.source, t.task_id, fmt(t.reward), fmt(t.metrics.turns), fmt(t.metrics.tool_calls),
          fmt(t.metrics.tokens), el("span", { title: ending(t) }, ending(t).split(" ")[0])] })), { numeric: [0, 3, 4, 5, 6] }));
  };
  filter.addEventListener("input", draw);
  source.addEventListener("change", draw);
  draw();
}

function rewardTerms(t) {
  const terms = Object.entries(t.rewards).filter(([, v]) => v !== null);
  const max = Math.max(1e-9, ...terms.map(([, v]) => Math.abs(v)));
  const rows = terms.map(([k, v]) => ({ cells: [k, fmt(v, 4), el("div", { class: "barbox" },
    el("span", { class: v >= 0 ? "pos" : "neg", style: `left:${v >= 0 ? 50 : 50 - (50 * Math.abs(v)) / max}%;width:${(50 * Math.abs(v)) / max}%` }))] }));
  const na = Object.entries(t.rewards).filter(([, v]) => v === null).map(([k]) => k);
  rows.push({ cells: [el("b", {}, "total"), el("b", {}, fmt(t.reward, 4)), na.length ? `not applicable: ${na.join(", ")}` : ""] });
  const tbl = table(["term", "value", ""], rows, { cls: "terms", numeric: [1] });
  tbl.querySelectorAll("tbody tr td:nth-child(3)").forEach((td) => td.classList.add("barcell"));
  return tbl;
}

function tokenChart(t) {
  const turns = t.tokens.turns;
  const W = 520, H = 170, L = 48, R = 10, T = 10, B = 24;
  const root = svg("svg", { class: "chart tokens", viewBox: `0 0 ${W} ${H}` });
  if (!turns.length) { root.append(svg("text", { x: L, y: H / 2 }, "no sampled turns")); return root; }
  const maxY = Math.max(...turns.map((x) => x.context), 1) * 1.08;
  const n = turns.length;
  const bw = (W - L - R) / n;
  const sx = (i) => L + bw * i + bw / 2;
  const sy = (y) => T + (1 - y / maxY) * (H - T - B);
  const axis = svg("g", { class: "axis" });
  for (const v of ticks(0, maxY, 4)) {
    axis.append(svg("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), class: "grid-line" }));
    axis.append(svg("text", { x: L - 4, y: sy(v) + 3, "text-anchor": "end" }, fmt(v)));
  }
  turns.forEach((x, i) => { if (n <= 30 || i % Math.ceil(n / 15) === 0) axis.append(svg("text", { x: sx(i), y: H - 8, "text-anchor": "middle" }, x.turn)); });
  root.append(axis);
  turns.forEach((x, i) => {
    const bar = svg("rect", { class: "sampled", x: sx(i) - bw * 0.3, width: bw * 0.6, y: sy(x.sampled), height: sy(0) - sy(x.sampled) });
    bar.append(svg("title", {}, `turn ${x.turn}: ${x.sampled} sampled, context ${x.context}`));
    root.append(bar);
    if (x.reset) root.append(svg("line", { class: "reset", x1: sx(i) - bw / 2, x2: sx(i) - bw / 2, y1: T, y2: H - B }));
  });
  root.append(svg("path", { class: "context", d: turns.map((x, i) => `${i ? "L" : "M"}${sx(i)},${sy(x.context)}`).join("") }));
  turns.forEach((x, i) => root.append(svg("circle", { class: "dot context-dot", cx: sx(i), cy: sy(x.context), r: 2.5 })));
  for (const s of (t.info.summaries || [])) {
    const i = turns.findIndex((x) => x.turn >= s.turn);
    if (i >= 0) root.append(svg("text", { class: "summary-mark", x: sx(i), y: T + 9, "text-anchor": "middle" }, "S"));
  }
  return root;
}

function swarmTimeline(tl) {
  const rows = [...tl.rows].sort((a, b) => a.start - b.start);
  const W = 620, L = 150, R = 12, rowH = 18, T = 6;
  const H = T + rowH * (rows.length + 1) + 20;
  const span = Math.max(tl.end - tl.start, 1e-9);
  const sx = (v) => L + ((v - tl.start) / span) * (W - L - R);
  const root = svg("svg", { class: "chart timeline", viewBox: `0 0 ${W} ${H}` });
  root.append(svg("rect", { class: "bar orchestrator", x: sx(tl.start), y: T, width: sx(tl.end) - sx(tl.start), height: rowH - 5 }));
  root.append(svg("text", { class: "bar-label", x: 4, y: T + rowH - 7 }, "orchestrator"));
  rows.forEach((r, i) => {
    const y = T + rowH * (i + 1);
    const bar = svg("rect", { class: "bar" + (r.critical ? " critical" : ""), x: sx(r.start), y, width: Math.max(2, sx(r.end) - sx(r.start)), height: rowH - 5 });
    bar.append(svg("title", {}, `${r.name}: ${fmt(r.start)}s → ${fmt(r.end)}s${r.critical ? " (critical path)" : ""}\n${r.answer || "(no answer)"}`));
    root.append(bar, svg("text", { class: "bar-label", x: 4, y: y + rowH - 7 }, r.name.slice(0, 22)));
  });
  const axis = svg("g", { class: "axis" });
  for (const v of ticks(0, span, 6)) axis.append(svg("text", { x: sx(tl.start + v), y: H - 4, "text-anchor": "middle" }, `${fmt(v)}s`));
  root.append(axis);
  return root;
}

function messageView(m) {
  const box = el("div", { class: `msg ${m.role}${m.summary ? " summary" : ""}` },
    el("span", { class: "role" }, m.role + (m.name ? ` · ${m.name}` : "")), m.summary ? el("span", { class: "badge" }, "summary") : null);
  if (m.parts) {
    const pre = el("pre", { class: "text" });
    for (const p of m.parts) {
      if (p.pruned) {
        const body = p.text.replace(/\n+$/, "");
        pre.append(el("del", { class: "pruned", title: `chunk ${p.chunk_id} pruned` }, body), el("span", { class: "badge bad" }, "pruned"),
          p.text.length > body.length ? "\n" : "");
      }
      else pre.append(p.text);
    }
    box.append(pre);
  } else if (m.content) box.append(el("pre", { class: "text" }, m.content));
  for (const c of m.tool_calls || []) box.append(el("div", { class: "call" }, `→ ${c.name}(${JSON.stringify(c.arguments)})`));
  return box;
}

function kvTable(obj) {
  return table(["", ""], Object.entries(obj).map(([k, v]) => ({ cells: [k, typeof v === "number" ? fmt(v, 4) : JSON.stringify(v)] })), { cls: "kv" });
}

function trajectoryDetail(t, nested) {
  const box = el("div", { class: "traj-detail-body", "data-key": t.key });
  box.append(el("div", { class: "detail-head" }, el("h3", {}, `task ${t.task_id}`),
    el("span", { class: "muted" }, `${t.source} · step ${t.step} · ${t.id}`),
    el("span", { class: "chip" }, `reward ${fmt(t.reward, 4)}`), el("span", { class: "chip" }, ending(t)),
    t.trainable ? null : el("span", { class: "chip bad" }, "not trainable"), t.error ? el("span", { class: "chip bad" }, t.error) : null));
  const left = el("div", {}, el("h3", {}, "Reward breakdown"), rewardTerms(t));
  const right = el("div", {}, el("h3", {}, `Token usage over turns${t.tokens.estimated ? " (estimated from text)" : ""}`), tokenChart(t),
    el("div", { class: "muted" }, "bars: sampled tokens per turn · line: context size · dashed: context rebuilt (new segment) · S: summary"));
  box.append(el("div", { class: "two" }, left, right));
  if (t.timeline) {
    box.append(el("h3", {}, "Sub-agent timeline" + (t.timeline.critical_steps ? ` · critical steps ${fmt(t.timeline.critical_steps)}` : "")),
      swarmTimeline(t.timeline), el("div", { class: "muted" }, "red: critical path (the slowest sub-agent of each wave of concurrent runs)"));
  }
  if (t.info.final_answer !== undefined) box.append(el("h3", {}, "Final answer"), el("pre", { class: "text" }, String(t.info.final_answer)));
  box.append(el("h3", {}, `Messages (${t.messages.length})`), ...t.messages.map(messageView));
  if (t.children.length) {
    box.append(el("h3", {}, `Sub-agents (${t.children.length})`),
      ...t.children.map((c) => el("details", {}, el("summary", {}, `${c.task_id || c.id}: reward ${fmt(c.reward)} · ${ending(c)}`), trajectoryDetail(c, true))));
  }
  const info = Object.fromEntries(Object.entries(t.info).filter(([k]) => k !== "final_answer"));
  box.append(el("div", { class: "two" }, el("div", {}, el("h3", {}, "Metrics"), kvTable(t.metrics)),
    el("div", {}, el("h3", {}, "Info and segments"), kvTable({ ...info, segments: t.segments.map((s) => `${s.tokens} tok (${s.sampled} sampled, v${s.policy_version})`) }))));
  return box;
}

function openTrajectory(key) {
  const t = DATA.trajectories.find((x) => x.key === key);
  const detail = document.getElementById("traj-detail");
  if (!t || !detail) return;
  detail.classList.remove("empty");
  detail.replaceChildren(trajectoryDetail(t, false));
  detail.scrollTop = 0;
  document.querySelectorAll("tr.traj-row").forEach((r) => r.classList.toggle("selected", r.dataset.key === key));
  if (location.hash !== `#t=${encodeURIComponent(key)}`) history.replaceState(null, "", `#t=${encodeURIComponent(key)}`);
}

renderHeader();
renderMetrics();
renderMonitors();
renderEvals();
renderTrajectoryList();
if (location.hash.startsWith("#t=")) openTrajectory(decodeURIComponent(location.hash.slice(3)));
document.body.dataset.ready = "1";
