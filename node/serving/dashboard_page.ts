// The dashboard at GET /: one page, no build step. It reads the server's live snapshots from GET /events
// (server-sent events, one `snapshot` a second; read with fetch so that it can send the API key, which it
// takes from the URL fragment #key=...) and draws the members, the Plan with each stage's active requests
// and KV bytes, the live tokens/s, and the per-token breakdown (compute per stage, wire per hop) of
// recent requests as a stacked bar chart. Every value goes into the page as text (textContent), never as HTML.

export const DASHBOARD_HTML = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>swactor</title>
<style>
  :root { --bg: #0f1115; --panel: #171a21; --line: #2a2f3a; --text: #e6e6e6; --dim: #9aa3b2; --ok: #5ccf8a; --warn: #e5c07b; --bad: #e06c75; }
  * { box-sizing: border-box; }
  body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; background: var(--bg); color: var(--text); }
  header { display: flex; gap: 24px; align-items: baseline; padding: 14px 20px; border-bottom: 1px solid var(--line); }
  header h1 { margin: 0; font-size: 18px; }
  .big { font-size: 22px; font-weight: 600; }
  .dim { color: var(--dim); }
  main { display: grid; grid-template-columns: minmax(0, 1.2fr) minmax(0, 1fr); gap: 16px; padding: 16px 20px; }
  section { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 12px 14px; min-width: 0; overflow-x: auto; }
  section.wide { grid-column: 1 / -1; }
  h2 { margin: 0 0 8px; font-size: 14px; text-transform: uppercase; letter-spacing: .04em; color: var(--dim); }
  table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
  th, td { text-align: left; padding: 4px 8px 4px 0; border-bottom: 1px solid var(--line); white-space: nowrap; max-width: 150px; overflow: hidden; text-overflow: ellipsis; }
  th { color: var(--dim); font-weight: 500; }
  .state-alive { color: var(--ok); } .state-suspect { color: var(--warn); } .state-dead, .state-left { color: var(--bad); }
  #ready.yes { color: var(--ok); } #ready.no { color: var(--warn); }
  .legend span { display: inline-block; margin-right: 12px; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
  svg text { fill: var(--dim); font-size: 11px; }
</style>
</head>
<body>
<header>
  <h1>swactor</h1>
  <span>model <b id="model">-</b></span>
  <span id="ready" class="no">connecting</span>
  <span><span id="tok-s" class="big">0</span> <span class="dim">tok/s</span></span>
  <span class="dim">running <b id="running">0</b> · waiting <b id="waiting">0</b> · KV positions <b id="kv">-</b></span>
</header>
<main>
  <section>
    <h2>Members</h2>
    <table><thead><tr><th>id</th><th>state</th><th>roles</th><th>adapter</th><th>GPU memory</th><th>measured</th><th>data</th></tr></thead>
    <tbody id="members"></tbody></table>
  </section>
  <section>
    <h2>Plan</h2>
    <div id="plan-summary" class="dim"></div>
    <table><thead><tr><th>stage</th><th>node</th><th>layers</th><th>experts</th><th>active</th><th>KV bytes</th><th>weights</th></tr></thead>
    <tbody id="stages"></tbody></table>
  </section>
  <section class="wide">
    <h2>Per-token breakdown of recent requests (ms: compute per stage, wire per hop)</h2>
    <div id="legend" class="legend"></div>
    <svg id="chart" width="100%" height="220" role="img" aria-label="per-token breakdown"></svg>
  </section>
  <section class="wide">
    <h2>Recent requests</h2>
    <table><thead><tr><th>request</th><th>route</th><th>prompt</th><th>completion</th><th>finish</th><th>first token ms</th><th>tok/s</th></tr></thead>
    <tbody id="recent"></tbody></table>
  </section>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const COLORS = ["#61afef", "#c678dd", "#98c379", "#d19a66", "#56b6c2", "#e5c07b", "#be5046", "#7f848e"];
const WIRE = "#e06c75";

function bytes(n) {
  if (typeof n !== "number") return "-";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + u[i];
}
function row(cells, cls) {
  const tr = document.createElement("tr");
  cells.forEach((c, i) => {
    const td = document.createElement("td");
    td.textContent = c === undefined || c === null ? "-" : String(c);
    td.title = td.textContent;
    if (cls && cls[i]) td.className = cls[i];
    tr.appendChild(td);
  });
  return tr;
}
function fill(id, rows) { $(id).replaceChildren(...rows); }

function measured(m) {
  const d = m.descriptor;
  if (!d) return "-";
  const parts = [];
  if (typeof d.read_gbps === "number") parts.push(d.read_gbps.toFixed(1) + " GB/s");
  if (typeof d.dispatch_ms === "number") parts.push(d.dispatch_ms.toFixed(2) + " ms/dispatch");
  return parts.join(", ") || "-";
}

function render(s) {
  $("model").textContent = s.model;
  $("ready").textContent = s.ready ? "ready" : "not ready: " + (s.why || "loading");
  $("ready").className = s.ready ? "yes" : "no";
  $("tok-s").textContent = String(s.tokS);
  $("running").textContent = String(s.running);
  $("waiting").textContent = String(s.waiting);
  $("kv").textContent = s.kv.held + " / " + s.kv.budget;
  const members = [...s.members].sort((a, b) => (b.id === s.self) - (a.id === s.self));
  fill("members", members.map((m) => row(
    [(m.id === s.self ? "* " : "") + m.id.slice(0, 12), m.state, m.roles.join(", "), m.adapter || "-",
     m.gpuMemoryBytes ? bytes(m.gpuMemoryBytes) : "-", measured(m), m.dataPath || "-"],
    [null, "state-" + m.state])));
  const plan = s.plan || {};
  const stages = plan.stages || [];
  const bits = [];
  if (plan.model && plan.model.name) bits.push(plan.model.name);
  if (stages.length) bits.push(stages.length + " stage(s)");
  if (plan.predicted && typeof plan.predicted.tokenMs === "number") bits.push("predicted " + plan.predicted.tokenMs.toFixed(2) + " ms/token");
  $("plan-summary").textContent = bits.join(" · ") || "no plan yet";
  fill("stages", stages.map((st, i) => {
    const r = s.stages.find((x) => x.index === i) || {};
    // MoE: experts per layer ({"layer": [ids]}); shown as a count over the stage's MoE layers.
    const experts = st.experts ? Object.values(st.experts).reduce((a, e) => a + (Array.isArray(e) ? e.length : 0), 0) : "-";
    return row(["stage-" + i, (st.node || "").slice(0, 12), "[" + (st.layers || r.layers || []).join(", ") + ")", experts,
      r.error ? "error: " + r.error : r.active, bytes(r.kvBytes), bytes(r.weightBytes)]);
  }));
  fill("recent", s.recent.map((r) => row([r.id, r.route, r.promptTokens, r.completionTokens, r.finish,
    r.firstTokenMs, r.tokS])));
  chart(s.recent);
}

function chart(recent) {
  const svg = $("chart");
  const W = svg.clientWidth || 800, H = 220, pad = 28;
  // The newest request's tokens after the first (decode steps), then older requests', up to 120 bars.
  const bars = [];
  for (const r of recent) for (const t of r.tokens.slice(1)) { if (bars.length < 120) bars.push({ r: r.id, t }); }
  bars.reverse();
  const stages = Math.max(0, ...bars.map((b) => b.t.computeMs.length));
  const total = (t) => t.computeMs.reduce((a, b) => a + b, 0) + t.wireMs.reduce((a, b) => a + (b || 0), 0);
  const max = Math.max(0.001, ...bars.map((b) => total(b.t)));
  const ns = "http://www.w3.org/2000/svg";
  const kids = [];
  const bw = bars.length ? (W - pad) / bars.length : 0;
  bars.forEach((b, i) => {
    let y = H - pad;
    const seg = (ms, color, what) => {
      if (!ms || ms <= 0) return;
      const h = (ms / max) * (H - pad - 8);
      const rect = document.createElementNS(ns, "rect");
      rect.setAttribute("x", String(pad + i * bw)); rect.setAttribute("y", String(y - h));
      rect.setAttribute("width", String(Math.max(1, bw - 1))); rect.setAttribute("height", String(h));
      rect.setAttribute("fill", color);
      const title = document.createElementNS(ns, "title");
      title.textContent = b.r + ": " + what + " " + ms.toFixed(3) + " ms";
      rect.appendChild(title);
      kids.push(rect);
      y -= h;
    };
    b.t.computeMs.forEach((ms, k) => seg(ms, COLORS[k % COLORS.length], "stage " + k + " compute"));
    b.t.wireMs.forEach((ms, k) => seg(ms, WIRE, "hop " + k + " wire"));
  });
  const label = (x, y, text) => { const t = document.createElementNS(ns, "text"); t.setAttribute("x", String(x)); t.setAttribute("y", String(y)); t.textContent = text; kids.push(t); };
  label(0, 12, max.toFixed(2) + " ms");
  label(0, H - pad, "0");
  label(pad, H - 8, bars.length ? bars.length + " decode tokens, oldest left" : "no requests yet");
  svg.replaceChildren(...kids);
  const legend = [];
  for (let k = 0; k < stages; k++) legend.push(["stage " + k + " compute", COLORS[k % COLORS.length]]);
  if (bars.some((b) => b.t.wireMs.some((w) => w))) legend.push(["wire", WIRE]);
  $("legend").replaceChildren(...legend.map(([name, color]) => {
    const span = document.createElement("span"); const i = document.createElement("i");
    i.style.background = color; span.appendChild(i); span.appendChild(document.createTextNode(name)); return span;
  }));
}

async function follow() {
  const key = new URLSearchParams(location.hash.slice(1)).get("key");
  const headers = key ? { authorization: "Bearer " + key } : {};
  for (;;) {
    try {
      const res = await fetch("/events", { headers });
      if (!res.ok) throw new Error("HTTP " + res.status);
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf("\\n\\n")) >= 0) {
          const block = buf.slice(0, i); buf = buf.slice(i + 2);
          const data = block.split("\\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\\n");
          if (data) render(JSON.parse(data));
        }
      }
    } catch (e) {
      $("ready").textContent = "disconnected (" + e.message + "); retrying";
      $("ready").className = "no";
    }
    await new Promise((r) => setTimeout(r, 2000));
  }
}
follow();
</script>
</body>
</html>
`;
