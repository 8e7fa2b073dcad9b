// swarmrl dashboard: polls /v1/dashboard and draws the pool with plain DOM and inline SVG.
// What members wrote (URLs, reasons) is hostile: it is only ever set as textContent or
// as an attribute value, never parsed as markup.
"use strict";

const POLL_MS = 3000;
const FIRST_DRAW = "swarmrl:first-draw"; // a performance mark at the first complete draw
const SVG = "http://www.w3.org/2000/svg";
const CURVES = [
  ["reward", "reward"],
  ["task_reward", "task reward"],
  ["length_error", "length error"],
  ["grad_norm", "grad norm"],
  ["clip_ratio", "clip ratio"],
  ["staleness_mean", "staleness (mean)"],
  ["heldout_accuracy", "held-out accuracy"],
];

function fmt(x, digits = 5) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return String(Number(x.toPrecision(digits)));
}

// A rate, a pace or a delay: three significant digits are all a reader can use.
function rough(x) {
  return fmt(x, 3);
}

function ago(now, t) {
  if (t === null || t === undefined) return "never";
  const s = Math.max(0, now - t);
  return (s < 10 ? s.toFixed(1) : String(Math.round(s))) + " s ago";
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function short(address) {
  return address.length > 14 ? address.slice(0, 8) + "…" + address.slice(-4) : address;
}

function addressCell(row, address) {
  const td = cell(row, short(address), "address", "text");
  td.title = address;
  return td;
}

function set(id, value) {
  document.getElementById(id).textContent = value;
}

function cell(row, value, col, cls) {
  const td = document.createElement("td");
  td.textContent = fmt(value);
  if (col) td.dataset.col = col;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}

function fill(tableId, items, build) {
  const body = document.querySelector("#" + tableId + " tbody");
  const rows = items.map((item) => {
    const tr = document.createElement("tr");
    build(tr, item);
    return tr;
  });
  body.replaceChildren(...rows);
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// One small line chart of (x, y) points; y may be null (a gap).
function lineChart(title, points, key) {
  const W = 260, H = 130, L = 44, R = 8, T = 18, B = 20;
  const svg = svgEl("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  svg.dataset.curve = key;
  svg.appendChild(svgEl("text", { class: "title", x: L, y: 12 }, title));
  const shown = points.filter((p) => p.y !== null && Number.isFinite(p.y));
  if (shown.length === 0) {
    svg.appendChild(svgEl("text", { x: L, y: H / 2 }, "not reported"));
    return svg;
  }
  const xs = shown.map((p) => p.x), ys = shown.map((p) => p.y);
  let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  svg.appendChild(svgEl("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  svg.appendChild(svgEl("text", { x: 2, y: T + 4 }, fmt(y1)));
  svg.appendChild(svgEl("text", { x: 2, y: H - B }, fmt(y0)));
  svg.appendChild(svgEl("text", { x: L, y: H - 6 }, "step " + fmt(x0)));
  svg.appendChild(svgEl("text", { x: W - R - 50, y: H - 6 }, "step " + fmt(x1)));
  const d = shown.map((p, i) => (i ? "L" : "M") + px(p.x).toFixed(1) + " " + py(p.y).toFixed(1));
  svg.appendChild(svgEl("path", { class: "line", d: d.join(" ") }));
  for (const p of shown) {
    const dot = svgEl("circle", { class: "dot", cx: px(p.x), cy: py(p.y), r: 2 });
    dot.appendChild(svgEl("title", {}, `step ${p.x}: ${fmt(p.y)}`));
    svg.appendChild(dot);
  }
  return svg;
}

// Verdicts per step, stacked by outcome.
function verdictChart(counts) {
  const W = 540, H = 140, L = 30, R = 8, T = 18, B = 20;
  const svg = svgEl("svg", { class: "chart", width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  svg.appendChild(svgEl("text", { class: "title", x: L, y: 12 }, "verdicts by step (accepted, rejected, soft)"));
  const bySteps = new Map();
  for (const v of counts) {
    const c = bySteps.get(v.step) || { accepted: 0, rejected: 0, soft: 0 };
    c[v.outcome] += v.files;
    bySteps.set(v.step, c);
  }
  const steps = [...bySteps.keys()].sort((a, b) => a - b);
  if (steps.length === 0) {
    svg.appendChild(svgEl("text", { x: L, y: H / 2 }, "no verdicts yet"));
    return svg;
  }
  const top = Math.max(...steps.map((s) => { const c = bySteps.get(s); return c.accepted + c.rejected + c.soft; }));
  const w = (W - L - R) / steps.length;
  steps.forEach((step, i) => {
    const c = bySteps.get(step);
    let y = H - B;
    for (const outcome of ["accepted", "rejected", "soft"]) {
      const h = (c[outcome] / top) * (H - T - B);
      if (h > 0) {
        const bar = svgEl("rect", { class: outcome, x: L + i * w + 1, y: y - h, width: Math.max(1, w - 2), height: h });
        bar.appendChild(svgEl("title", {}, `step ${step}: ${c[outcome]} ${outcome}`));
        svg.appendChild(bar);
        y -= h;
      }
    }
  });
  svg.appendChild(svgEl("text", { x: 2, y: T + 4 }, fmt(top)));
  svg.appendChild(svgEl("text", { x: L, y: H - 6 }, "step " + steps[0]));
  svg.appendChild(svgEl("text", { x: W - R - 50, y: H - 6 }, "step " + steps[steps.length - 1]));
  return svg;
}

function failedCheck(reason) {
  const parts = reason.split(": ");
  return parts[0] === "rejected" && parts.length > 1 ? parts[1] : parts[0];
}

function render(d) {
  const st = d.status, run = d.run;
  set("run-id", st.recipe && st.recipe.run_id ? "· " + st.recipe.run_id : "");
  set("updated", "updated " + new Date(d.now * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC");
  set("run-step", run.step === null ? "–" : fmt(run.step) + (run.steps_total ? " / " + run.steps_total : ""));
  set("run-state", st.finished ? "finished" : run.step === null ? "waiting for the trainer" : "training");
  set("run-pace", rough(run.steps_per_minute));
  set("run-eta", st.finished ? "done" : duration(run.eta_seconds));
  set("run-needed", fmt(run.needed));
  set("run-issued", fmt(run.issued));
  set("run-uploaded", fmt(run.uploaded));
  set("run-usable", fmt(run.usable));
  set("run-trained", fmt(run.trained));
  set("run-checkpoint", st.checkpoint ? st.checkpoint.step + " · " + st.checkpoint.blake3.slice(0, 12) : "–");
  fill("steps", st.steps, (tr, s) => {
    tr.dataset.step = s.step;
    cell(tr, s.step, "step");
    cell(tr, s.target_samples, "needed");
    cell(tr, s.usable_samples, "usable");
    cell(tr, s.read_samples, "read");
    cell(tr, s.submissions, "files");
    cell(tr, s.open_assignments, "open");
    cell(tr, s.lapsed_assignments, "lapsed");
    cell(tr, s.trained, "trained");
    cell(tr, s.full ? "yes" : "no", "full");
  });

  const charts = CURVES.map(([key, title]) =>
    lineChart(title, d.curves.map((c) => ({ x: c.step, y: c[key] })), key));
  document.getElementById("charts").replaceChildren(...charts);

  const activity = new Map(d.members.map((m) => [m.address, m]));
  fill("member-table", st.members, (tr, m) => {
    const a = activity.get(m.address) || {};
    tr.dataset.address = m.address;
    if (m.status === "ejected") tr.className = "ejected";
    addressCell(tr, m.address);
    cell(tr, m.role, "role");
    cell(tr, m.status, "status");
    cell(tr, ago(d.now, m.last_heartbeat), "heartbeat");
    cell(tr, m.stake, "stake");
    cell(tr, m.balance, "balance");
    cell(tr, m.paid, "paid");
    cell(tr, a.uploaded, "uploaded");
    cell(tr, a.accepted, "accepted");
    cell(tr, a.rejected, "rejected");
    cell(tr, a.trained, "trained");
    cell(tr, rough(a.samples_per_second), "rate");
    cell(tr, a.holds, "holds");
    cell(tr, rough(a.reached_seconds), "reached");
    cell(tr, a.bytes_served == null ? null : a.bytes_served / 1e6, "served");
    cell(tr, m.url || "", "url", "wrap");
  });

  set("verdicts-accepted", fmt(st.verdicts.accepted));
  set("verdicts-rejected", fmt(st.verdicts.rejected));
  set("verdicts-soft", fmt(st.verdicts.soft));
  document.getElementById("verdict-chart").replaceChildren(verdictChart(d.verdicts));
  fill("check-table", Object.entries(d.by_check).sort(), (tr, [check, n]) => {
    tr.dataset.check = check;
    cell(tr, check, "check");
    cell(tr, n, "rejects");
  });
  fill("slashing-table", st.slashings, (tr, x) => {
    tr.dataset.address = x.address;
    addressCell(tr, x.address);
    cell(tr, x.step, "step");
    cell(tr, failedCheck(x.reason), "check");
    cell(tr, x.slashed, "slashed");
    cell(tr, x.voided_files, "voided");
    cell(tr, x.tainted_files, "tainted");
    cell(tr, x.tainted_steps.join(", "), "tainted_steps");
    cell(tr, x.reason, "reason", "wrap");
  });
  fill("refusal-table", st.refusals, (tr, x) => {
    tr.dataset.address = x.address;
    addressCell(tr, x.address);
    cell(tr, x.role, "role");
    cell(tr, x.reason, "reason", "wrap");
  });

  fill("checkpoint-table", d.checkpoints, (tr, c) => {
    tr.dataset.step = c.step;
    const roles = Object.entries(c.held_by).sort();
    cell(tr, c.step + (c.final ? " (final)" : ""), "step");
    cell(tr, c.blake3.slice(0, 16), "blake3");
    cell(tr, roles.reduce((n, [, k]) => n + k, 0), "held_by");
    cell(tr, roles.map(([role, k]) => k + " " + role + (k === 1 ? "" : "s")).join(", "), "roles", "text");
    cell(tr, c.first_seconds, "first");
    cell(tr, c.last_seconds, "last");
  });
  document.body.dataset.rendered = String(d.now);
  // The first complete draw, for benchmarks/bench_dashboard.py's browser timing.
  if (!performance.getEntriesByName(FIRST_DRAW).length) performance.mark(FIRST_DRAW);
}

async function poll() {
  try {
    const response = await fetch("/v1/dashboard", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    render(await response.json());
  } catch (err) {
    set("updated", "the orchestrator did not answer (" + err.message + "); retrying");
  }
  setTimeout(poll, POLL_MS);
}

poll();
