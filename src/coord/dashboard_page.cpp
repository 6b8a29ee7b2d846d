// The dashboard's one page: plain HTML, CSS, JavaScript and SVG, nothing loaded from elsewhere.
// It reads the run token from its own URL (?token=...) and polls /api/status every 2 s.
namespace spes {

extern const char* const kDashboardPage;
const char* const kDashboardPage = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>spes run</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } .sub { color: #666; margin-bottom: 16px; }
table { border-collapse: collapse; margin-bottom: 20px; }
th, td { padding: 4px 10px; text-align: right; border-bottom: 1px solid #ddd; }
th { background: #f4f4f4; } td.l, th.l { text-align: left; }
.alive { color: #1a7f37; font-weight: 600; } .dead { color: #cf222e; font-weight: 600; } .done { color: #0969da; font-weight: 600; }
svg { border: 1px solid #ddd; background: #fff; } .err { color: #cf222e; }
</style></head>
<body>
<h1 id="title">spes run</h1>
<div class="sub" id="summary">loading…</div>
<table id="nodes"><thead><tr><th class="l">node</th><th class="l">state</th><th class="l">experts</th><th>step</th>
<th>loss</th><th>tokens/s</th><th>round</th><th>in flight</th><th>last round in</th><th>bytes in</th><th>bytes out</th><th>memory</th><th title="peer payloads refused / calls refused for token, run or arguments">refused</th></tr></thead>
<tbody></tbody></table>
<h2 style="font-size:16px">Training loss per node</h2>
<svg id="loss" width="900" height="320"></svg>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token") || "";
const colors = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#6e7781"];
function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(2) : n) + " " + u[i];
}
function cell(row, text, cls) { const td = row.insertCell(); td.textContent = text; if (cls) td.className = cls; return td; }
function drawLoss(nodes) {
  const svg = document.getElementById("loss"), W = 900, H = 320, L = 50, B = 30;
  const pts = nodes.flatMap(n => n.loss_curve);
  svg.innerHTML = "";
  if (!pts.length) return;
  const x0 = Math.min(...pts.map(p => p[0])), x1 = Math.max(...pts.map(p => p[0])) || 1;
  const y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  const sx = s => L + (W - L - 10) * (s - x0) / Math.max(1, x1 - x0);
  const sy = v => 10 + (H - B - 10) * (1 - (v - y0) / Math.max(1e-9, y1 - y0));
  const ns = "http://www.w3.org/2000/svg";
  const text = (x, y, t, anchor) => { const e = document.createElementNS(ns, "text"); e.setAttribute("x", x);
    e.setAttribute("y", y); e.setAttribute("font-size", "11"); e.setAttribute("text-anchor", anchor || "start");
    e.textContent = t; svg.appendChild(e); };
  for (let k = 0; k <= 4; k++) { const v = y0 + (y1 - y0) * k / 4; text(L - 4, sy(v) + 4, v.toFixed(2), "end"); }
  text(L, H - 8, "step " + x0); text(W - 10, H - 8, "step " + x1, "end");
  nodes.forEach((n, i) => {
    if (!n.loss_curve.length) return;
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("fill", "none"); line.setAttribute("stroke", colors[i % colors.length]);
    line.setAttribute("stroke-width", "1.5"); line.setAttribute("data-node", n.id);
    line.setAttribute("points", n.loss_curve.map(p => sx(p[0]) + "," + sy(p[1])).join(" "));
    svg.appendChild(line);
    text(W - 80, 20 + 14 * i, "node " + n.id);
    const key = document.createElementNS(ns, "rect"); key.setAttribute("x", W - 95); key.setAttribute("y", 12 + 14 * i);
    key.setAttribute("width", 10); key.setAttribute("height", 3); key.setAttribute("fill", colors[i % colors.length]);
    svg.appendChild(key);
  });
}
async function refresh() {
  try {
    const r = await fetch("/api/status", { headers: { "Authorization": "Bearer " + token } });
    if (!r.ok) throw new Error(r.status === 401 ? "the run token is missing or wrong: open this page as /?token=RUN_TOKEN" : "HTTP " + r.status);
    const s = await r.json();
    document.getElementById("title").textContent = "spes run '" + s.run + "'";
    const alive = s.nodes.filter(n => n.alive && !n.done).length, tps = s.nodes.reduce((a, n) => a + (n.alive ? n.tokens_per_s : 0), 0);
    document.getElementById("summary").textContent = s.nodes.length + " nodes, " + alive + " alive | round " + s.round +
      " | plan " + s.plan_version + " | " + Math.round(tps) + " tokens/s in all | updated " + new Date().toLocaleTimeString();
    const body = document.querySelector("#nodes tbody"); body.innerHTML = "";
    for (const n of s.nodes) {
      const row = body.insertRow(); row.id = "node-" + n.id;
      cell(row, "node " + n.id + " (" + n.address + ")", "l");
      const state = n.done ? "done" : n.alive ? "alive" : "dead";
      cell(row, state + (n.member ? "" : " (not a member)"), "l " + state);
      cell(row, n.experts.join(","), "l"); cell(row, n.step); cell(row, n.loss ? n.loss.toFixed(4) : "");
      cell(row, Math.round(n.tokens_per_s)); cell(row, n.round);
      cell(row, n.round_in_flight ? "round " + n.round_in_flight : n.round ? "+" + n.round_delay + " steps" : "");
      cell(row, bytes(n.last_sync_bytes_in));
      cell(row, bytes(n.bytes_in_total)); cell(row, bytes(n.bytes_out_total)); cell(row, bytes(n.peak_rss_bytes));
      cell(row, n.rejected_payloads + "/" + n.refused_calls).title = n.last_refusal;
    }
    drawLoss(s.nodes);
  } catch (e) {
    document.getElementById("summary").innerHTML = "<span class=err></span>";
    document.querySelector("#summary .err").textContent = "cannot read the status: " + e.message;
  }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>
)HTML";

}  // namespace spes
