// The run page: fetch what the server computes from the journal (GET /v1/runs/{id}/waterfall),
// redraw on every journal event that arrives over SSE (the same-origin cookie authenticates both).
// Each attempt is its own bar; a lost attempt's dead time until the recovery is drawn as such
// (docs/api.md, "The dashboard"). Helpers (el, seconds, ...) are in dom.js; the step panel, DAG and
// approvals in panel.js, dag.js and approvals.js.
"use strict";

function placed(node, left, width) {
  node.style.left = `${left}%`;
  if (width !== undefined) node.style.width = `${width}%`;
  return node;
}

function bar(cls, from, width, scale, title) {
  const node = placed(el("div", {class: "bar " + cls}), from * scale, Math.max(width * scale, 0.4));
  if (title) node.title = title;
  return node;
}

function tick(cls, at, scale, title) {
  return placed(el("div", {class: "mark " + cls, title: title}), at * scale);
}

function lane(row, end, scale) {
  const box = el("div", {class: "lane" + (row.status === "skipped" ? " skipped" : "")});
  if (row.status === "skipped" || row.status === "reused") return box;  // neither ran in this run
  box.append(bar("queue", row.ready_at || 0, row.queue_s, scale, `queued ${row.queue_s.toFixed(3)}s`));
  for (const d of row.dead) {
    box.append(bar("dead", d.from, d.to - d.from, scale,
                   `no sign of life from ${seconds(d.from)} until the recovery at ${seconds(d.to)}`));
  }
  for (const b of row.bars) {
    const until = b.ended_at === null ? end : b.ended_at;
    const title = `attempt ${b.attempt}, generation ${b.generation}${b.worker ? ", " + b.worker : ""}: ${b.outcome}`;
    box.append(bar("attempt " + b.outcome, b.started_at, until - b.started_at, scale, title));
  }
  for (const w of row.waits) {
    const until = w.to === null ? end : w.to;
    box.append(bar("wait", w.from, until - w.from, scale, `waiting ${(until - w.from).toFixed(3)}s`));
  }
  for (const r of row.retries) box.append(tick("retry", r.at, scale, `retry after attempt ${r.attempt}: ${r.error}`));
  for (const at of row.recoveries) box.append(tick("recovery", at, scale, `recovery at ${seconds(at)}`));
  if (row.anomalies.length) {
    box.append(tick("anomaly", row.started_at || 0, scale, "anomaly: " + row.anomalies.join(", ")));
  }
  return box;
}

function stepLabel(row) {
  const runs = row.bars.length;
  return row.step_id + (row.attempts > 1 ? ` (attempt ${row.attempts})` : "") + (runs > 1 ? ` · ${runs} bars` : "");
}

function showRunError(run) {
  // A finished run's error, in words, without a click: which step, what failed, and why.
  const box = document.getElementById("run-error"), error = run.error;
  if (!box) return;
  box.hidden = !error || !["failed", "cancelled"].includes(run.status);
  if (box.hidden) return;
  if (error.code === "cancelled") {
    box.textContent = `cancelled by ${error.by || "someone"}` + (error.reason ? `: ${error.reason}` : "");
    return;
  }
  const head = error.step_id ? `${run.status} at step ${error.step_id}` : run.status;
  const what = error.type ? `${error.type}: ` : "";
  box.textContent = `${head}: ${what}${error.message || error.code || ""}`;
}

function render(runId, data) {
  const run = data.run, body = document.querySelector("#waterfall tbody");
  const status = document.getElementById("status");
  status.textContent = run.status;
  status.className = "status " + run.status;
  const receipt = document.getElementById("receipt");  // present when receipts are on
  if (receipt) receipt.hidden = !["succeeded", "failed", "cancelled"].includes(run.status);
  showLineageActions(run.status);
  showRunError(run);
  const ran = data.rows.filter(r => r.status !== "skipped").length;
  document.getElementById("summary").textContent =
    `${ran} steps, ${data.rows.length - ran} skipped, ${data.duration_s.toFixed(2)}s, ` +
    `${run.input_tokens + run.output_tokens} tokens, $${Number(run.cost_usd).toFixed(6)}`;
  const scale = 100 / Math.max(data.duration_s, 0.001);
  body.replaceChildren();
  for (const row of data.rows) {
    const tr = el("tr", {"data-step": row.step_id, class: "step-row" + (row.status === "skipped" ? " skipped" : "")});
    tr.append(el("td", {class: "step-name"}, stepLabel(row)));
    tr.append(el("td", {class: "status " + row.status},
                 row.status === "skipped" ? `skipped (${row.skip_reason})`
                   : row.reused_from ? `reused from ${row.reused_from.run_id}` : row.status));
    const timeline = el("td", {});
    timeline.append(lane(row, data.duration_s, scale));
    tr.append(timeline);
    const skipped = row.status === "skipped" || row.status === "reused";  // neither ran in this run
    tr.append(el("td", {}, skipped ? "" : row.queue_s.toFixed(3) + "s"));
    tr.append(el("td", {}, skipped ? "" : row.run_s.toFixed(3) + "s"));
    tr.append(el("td", {}, row.wait_s ? row.wait_s.toFixed(3) + "s" + (row.waiting_for ? ` (${row.waiting_for})` : "") : ""));
    tr.append(el("td", {}, skipped ? "" : String(row.input_tokens + row.output_tokens)));
    tr.append(el("td", {}, skipped ? "" : "$" + Number(row.cost_usd).toFixed(6)));
    const actions = el("td", {});
    if (row.child_run_id) actions.append(el("a", {href: "/runs/" + encodeURIComponent(row.child_run_id)}, "child run"));
    if (row.pending_approval) actions.append(el("a", {href: "#approval-" + row.step_id, class: "to-approval"}, "decide"));
    tr.append(actions);
    tr.addEventListener("click", (e) => { if (!e.target.closest("a")) openPanel(runId, row.step_id); });
    body.append(tr);
  }
  const markers = document.getElementById("markers");
  markers.textContent = data.markers.map(m => m.kind === "recovery"
      ? `re-driven at ${m.at.toFixed(2)}s (generation ${m.generation}: ${m.resumed_steps.join(", ")})`
      : m.kind === "anomaly_detected"
        ? `anomaly ${m.anomaly}${m.step_id ? " on " + m.step_id : ""} at ${m.at.toFixed(2)}s: ${m.message}`
        : `${m.kind} ${m.step_id || ""} at ${m.at.toFixed(2)}s`).join(" · ");
  drawDag(runId, data.dag);
  renderApprovals(runId, data.rows, () => refresh(runId));
  refreshPanel(runId);
}

async function refresh(runId) {
  const reply = await fetch(runPath(runId, "/waterfall"), {credentials: "same-origin"});
  if (reply.ok) render(runId, await reply.json());
}

function startWaterfall(runId) {
  refresh(runId);
  let pending = null;
  const source = new EventSource(runPath(runId, "/events"));
  source.onmessage = source.onerror = null;
  const onEvent = () => { if (!pending) pending = setTimeout(() => { pending = null; refresh(runId); }, 100); };
  for (const kind of ["run_queued", "step_started", "step_completed", "step_failed", "step_retrying",
                      "step_waiting", "approval_decided", "step_in_doubt", "run_recovered",
                      "run_succeeded", "run_failed", "run_cancelled"]) {
    source.addEventListener(kind, (e) => {
      onEvent();
      if (kind.startsWith("run_") && kind !== "run_queued" && kind !== "run_recovered") source.close();
    });
  }
}

// Started from here, not from an inline <script> (the CSP allows none): the page names its run.
const waterfallTable = document.getElementById("waterfall");
if (waterfallTable && waterfallTable.dataset.runId) startWaterfall(waterfallTable.dataset.runId);
