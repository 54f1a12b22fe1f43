// The live page (exporter/web/page.py is its HTML): polls /api/v1/power,
// /api/v1/findings and /api/v1/health about once a second and draws the waveform with
// uPlot. The next poll is scheduled when the last has answered, so a slow node is never
// asked twice at once.
// Everything is written with textContent: job ids and messages come from the node.
(function () {
  "use strict";

  const PERIOD_MS = 1000;
  const RETRY_MS = 3000;
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#ad494a", "#637939",
    "#8c6d31", "#843c39", "#7b4173"];
  const state = { seconds: 60, hidden: new Set(), updates: 0, gpus: -1, focus: null,
    xmin: null, xmax: null, nodeChart: null, gpuChart: null };
  const $ = (id) => document.getElementById(id);

  function el(tag, text, cls) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (cls) node.className = cls;
    return node;
  }

  function colour(gpu) { return COLORS[gpu % COLORS.length]; }

  async function getJSON(path) {
    // against the origin, not the page's URL: opened as https://user:pass@node/, a
    // relative URL would carry the credentials, which fetch() refuses; the browser still
    // sends the ones it has for this origin
    const url = new URL(path, window.location.origin);
    const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error(path + ": HTTP " + response.status);
    return response.json();
  }

  // -- charts ------------------------------------------------------------------------------

  function chartOptions(container, series, height) {
    return {
      width: Math.max(300, container.clientWidth), height: height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      // both charts show the same span, the selected window up to the newest sample
      scales: { x: { time: true, range: (u, min, max) =>
        state.xmax === null ? [min, max] : [state.xmin, state.xmax] } },
      focus: { alpha: 0.15 },
      axes: [{}, { label: "W", size: 60 }],
      series: [{}].concat(series),
    };
  }

  function buildCharts(gpuCount) {
    const nodeBox = $("node-chart");
    const gpuBox = $("gpu-chart");
    nodeBox.textContent = "";
    gpuBox.textContent = "";
    const node = [{ label: "node", stroke: "#333", width: 1.5, fill: "rgba(60,60,60,0.08)",
      points: { show: false } }];
    const gpus = [];
    for (let g = 0; g < gpuCount; g++) {
      gpus.push({ label: "GPU " + g, stroke: colour(g), width: 1, points: { show: false },
        show: !state.hidden.has(g) });
    }
    state.nodeChart = new uPlot(chartOptions(nodeBox, node, 170), [[], []], nodeBox);
    state.gpuChart = new uPlot(chartOptions(gpuBox, gpus, 300),
      [[]].concat(gpus.map(() => [])), gpuBox);
    gpuBox.dataset.series = String(gpuCount);
    state.gpus = gpuCount;
    buildTable(gpuCount);
    applyFocus();
  }

  function drawPower(power) {
    const ids = Object.keys(power.gpus).map(Number).sort((a, b) => a - b);
    if (ids.length !== state.gpus) buildCharts(ids.length);
    const node = power.node;
    let end = node.timestamps.length ? node.timestamps[node.timestamps.length - 1] : null;
    for (const g of ids) {
      const t = power.gpus[g].timestamps;
      if (t.length && (end === null || t[t.length - 1] > end)) end = t[t.length - 1];
    }
    state.xmax = end;
    state.xmin = end === null ? null : end - power.seconds;
    state.nodeChart.setData([node.timestamps, node.watts]);
    // each GPU has its own driver timestamps: join them onto one x axis (uPlot leaves
    // the other GPUs' instants undefined, and draws a line through them)
    const tables = ids.map((g) => [power.gpus[g].timestamps, power.gpus[g].watts]);
    const joined = tables.length ? uPlot.join(tables) : [[]];
    state.gpuChart.setData(joined);
    const box = $("gpu-chart");
    box.dataset.points = String(joined[0].length);
    box.dataset.seconds = String(power.seconds);
    const hz = power.sample_interval_seconds ? 1 / power.sample_interval_seconds : null;
    $("rate").textContent = hz ? "native rate " + hz.toFixed(0) + " samples/s, band 0-" +
      power.observable_band_hz[1].toFixed(1) + " Hz" : "";
  }

  // -- the GPU table: the legend, the selector and the per-GPU summary at once ------------

  function buildTable(gpuCount) {
    const body = document.querySelector("#gpu-table tbody");
    body.textContent = "";
    for (let g = 0; g < gpuCount; g++) {
      const row = el("tr");
      row.dataset.gpu = String(g);
      const box = el("input");
      box.type = "checkbox";
      box.checked = !state.hidden.has(g);
      box.id = "show-" + g;
      box.addEventListener("change", () => showGpu(g, box.checked));
      const swatch = el("span", null, "swatch");
      swatch.style.background = colour(g);
      const pick = el("td");
      pick.append(box, swatch);
      const label = el("td", "GPU " + g, "gpu-name");
      label.title = "focus GPU " + g + " in the chart (click again: all)";
      label.addEventListener("click", () => focusGpu(g));
      row.append(pick, label, el("td", "", "model"), el("td", "", "job"),
        el("td", "", "num watts"), el("td", "", "gpu-state"));
      body.append(row);
    }
  }

  function showGpu(g, show) {
    if (show) state.hidden.delete(g); else state.hidden.add(g);
    const box = $("show-" + g);
    if (box) box.checked = show;
    if (state.gpuChart) state.gpuChart.setSeries(g + 1, { show: show });
  }

  // A focused GPU is drawn at full strength, the others faded (uPlot's series focus).
  function focusGpu(g) {
    state.focus = state.focus === g ? null : g;
    applyFocus();
  }

  function applyFocus() {
    if (state.gpuChart) state.gpuChart.setSeries(state.focus === null ? null : state.focus + 1,
      { focus: true });
    for (const row of document.querySelectorAll("#gpu-table tbody tr")) {
      row.classList.toggle("focused", Number(row.dataset.gpu) === state.focus);
    }
    $("gpu-chart").dataset.focus = state.focus === null ? "" : String(state.focus);
  }

  function fillTable(summary, flagged) {
    for (const gpu of summary.gpus) {
      const row = document.querySelector('#gpu-table tr[data-gpu="' + gpu.gpu + '"]');
      if (!row) continue;
      row.querySelector(".model").textContent = gpu.name || "";
      row.querySelector(".job").textContent = gpu.jobs.length ? gpu.jobs.join(", ") : "-";
      row.querySelector(".watts").textContent =
        gpu.watts === null ? "" : gpu.watts.toFixed(0) + " W";
      const status = gpu.hung ? "stuck" : gpu.lost ? "lost" : gpu.up ? "up" : "down";
      const kinds = flagged.get(gpu.gpu) || [];
      const cell = row.querySelector(".gpu-state");
      cell.textContent = [status].concat(kinds).join(" · ").replace(/_/g, " ");
      cell.className = "gpu-state " + (!gpu.up ? "bad" : kinds.length ? "warn" : "ok");
    }
  }

  // -- findings and the node summary ---------------------------------------------------------

  function age(now, then) {
    const s = Math.max(0, now - then);
    if (s < 90) return s.toFixed(0) + " s ago";
    if (s < 5400) return (s / 60).toFixed(0) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }

  function drawFindings(answer) {
    const list = $("findings");
    const flagged = new Map();  // GPU -> kinds of its warnings and critical findings
    list.textContent = "";
    for (const f of answer.findings) {
      const item = el("li", null, "finding sev-" + f.severity);
      item.dataset.kind = f.kind;
      const when = f.since !== null ? "since " + clock(f.since) : age(answer.time, f.time);
      item.append(el("span", f.severity, "sev"), el("span", f.message, "message"),
        el("span", when, "when"));
      if (f.gpu !== null) {
        item.dataset.gpu = String(f.gpu);
        item.title = "focus GPU " + f.gpu + " in the chart";
        item.addEventListener("click", () => focusGpu(f.gpu));
        if (f.severity !== "info") {
          const kinds = flagged.get(f.gpu) || [];
          if (!kinds.includes(f.kind)) kinds.push(f.kind);
          flagged.set(f.gpu, kinds);
        }
      }
      list.append(item);
    }
    if (!answer.findings.length) list.append(el("li", "nothing to report", "muted"));
    $("findings-count").textContent = "(" + answer.findings.length + ")";
    drawSummary(answer.summary, answer.time, flagged);
  }

  // productive over held GPU time since the exporter started, and the largest badput
  // states (docs/goodput.md)
  function goodputLine(g) {
    if (!g || g.ratio === null) return "no GPU time held yet";
    const sec = g.gpu_seconds;
    let held = 0;
    for (const [state, v] of Object.entries(sec)) {
      if (state !== "unallocated" && state !== "unknown") held += v;
    }
    const bad = ["checkpoint", "stalled", "starting", "idle", "failed"]
      .filter((k) => sec[k] > 0).sort((a, b) => sec[b] - sec[a]).slice(0, 3)
      .map((k) => k + " " + (100 * sec[k] / held).toFixed(1) + " %");
    const lost = g.lost_progress_estimate;
    return (100 * g.ratio).toFixed(1) + " % of held GPU time productive since start" +
      (bad.length ? " (" + bad.join(", ") + ")" : "") +
      (lost.failures ? "; progress lost to " + lost.failures + " failure(s), estimated: " +
        lost.gpu_seconds.toFixed(0) + " GPU-seconds" : "");
  }

  // who writes the jobs' checkpoints, for how long and how often (docs/goodput.md)
  function checkpointsLine(g) {
    const lines = g ? Object.entries(g.checkpoints || {}) : [];
    if (!lines.length) return "none seen";
    if (lines.length === 1 && lines[0][0] === "node") return lines[0][1];
    return lines.map(([job, line]) => "job " + job + ": " + line).join("; ");
  }

  function drawSummary(s, now, flagged) {
    $("gpus").textContent = String(s.gpu_count);
    $("backend").textContent = s.backend + (s.backend === "fake" ? " (scenario " +
      s.scenario + ")" : "");
    // the exporter's own readiness, apart from the GPUs' verdict (drawHealth)
    $("readiness").textContent = s.readiness.words;
    $("readiness").dataset.status = s.readiness.status;
    $("node").textContent = s.node;
    const rows = [
      ["GPUs up", s.gpus_up + " of " + s.expected_gpus + " expected"],
      ["exporter", s.readiness.words],
      ["sampling", s.sample_interval_seconds ? "every " +
        (s.sample_interval_seconds * 1000).toFixed(0) + " ms" : "-"],
      ["step period", s.step ? (s.step.period_seconds * 1000).toFixed(0) + " ms (" +
        s.step.frequency_hz.toFixed(2) + " Hz), from the power of the compute phases" :
        "no clear step swing"],
      ["goodput", goodputLine(s.goodput)],
      ["checkpoints", checkpointsLine(s.goodput)],
      ["version", s.version + ", up " + age(now, s.started_at).replace(" ago", "")],
      ["updated", clock(now)],
    ];
    const list = $("summary");
    list.textContent = "";
    for (const [key, value] of rows) list.append(el("dt", key), el("dd", value));
    fillTable(s, flagged);
  }

  // -- the health verdict (/api/v1/health) -------------------------------------------------

  function verdictItem(who, v, gpu) {
    const item = el("li", null, "verdict-item verdict-" + v.state);
    item.dataset.state = v.state;
    item.dataset.action = v.action;
    item.append(el("span", v.state, "sev"), el("span", who + (v.action !== "none" ?
      ": " + v.action_words : ""), "message"), el("span", v.reasons, "when"));
    if (gpu !== null) {
      item.dataset.gpu = gpu;
      item.title = "focus GPU " + gpu + " in the chart";
      item.addEventListener("click", () => focusGpu(Number(gpu)));
    }
    return item;
  }

  function drawHealth(h) {
    const verdict = $("health-verdict");
    verdict.textContent = h.node.state + (h.node.action !== "none" ? ": " +
      h.node.action_words : "");
    verdict.dataset.state = h.node.state;
    $("verdict").textContent = h.summary;
    $("verdict").dataset.state = h.node.state;
    const list = $("health-list");
    list.textContent = "";
    const own = h.node.checks.filter((c) => c.state === "failed" || c.state === "warning");
    for (const c of own) {
      // the check's own state, action and reason, as the verdict says them; a check
      // judged per InfiniBand port names its port (the name repeats once per port)
      const where = c.port !== undefined ? " (" + c.device + " port " + c.port + ")" : "";
      const item = verdictItem("node " + c.name.replace(/_/g, " ") + where,
        { state: c.state, action: c.action, action_words: c.action_words,
          reasons: c.reason }, null);
      if (c.port !== undefined) item.dataset.port = c.device + "/" + c.port;
      list.append(item);
    }
    for (const [gpu, v] of Object.entries(h.gpus)) {
      if (v.state !== "ok" && v.state !== "not_applicable") {
        list.append(verdictItem("GPU " + gpu, v, gpu));
      }
    }
    if (!list.children.length) list.append(el("li", "every check passes", "muted"));
  }

  // -- the loop ------------------------------------------------------------------------------

  async function poll() {
    let wait = PERIOD_MS;
    try {
      const [power, found, health] = await Promise.all([
        getJSON("/api/v1/power?seconds=" + state.seconds), getJSON("/api/v1/findings"),
        getJSON("/api/v1/health")]);
      drawPower(power);
      drawFindings(found);
      drawHealth(health);
      state.updates += 1;
      document.body.dataset.updates = String(state.updates);
      $("conn").textContent = "";
    } catch (err) {
      $("conn").textContent = "(no answer: " + err.message + "; retrying)";
      wait = RETRY_MS;
    }
    setTimeout(poll, wait);
  }

  function resize() {
    for (const [chart, id] of [[state.nodeChart, "node-chart"], [state.gpuChart, "gpu-chart"]]) {
      if (chart) chart.setSize({ width: Math.max(300, $(id).clientWidth), height: chart.height });
    }
  }

  $("window").addEventListener("change", (event) => {
    state.seconds = Number(event.target.value);
  });
  $("all").addEventListener("click", () => { for (let g = 0; g < state.gpus; g++) showGpu(g, true); });
  $("none").addEventListener("click", () => { for (let g = 0; g < state.gpus; g++) showGpu(g, false); });
  window.addEventListener("resize", resize);
  // /#gpu=5 opens the page with GPU 5 in focus (a link from an alert, say)
  const wanted = /^#gpu=(\d{1,3})$/.exec(window.location.hash);
  if (wanted) state.focus = Number(wanted[1]);
  poll();
})();
