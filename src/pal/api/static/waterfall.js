// The run waterfall: fetch the rows the server computes from the journal, redraw on every journal
// event that arrives over SSE (the same-origin cookie authenticates both). Under the dashboard's CSP
// (docs/api.md, "Security headers") text goes in with textContent only, never as markup, and
// positions are set through element.style (CSSOM), never as a style="" attribute.
"use strict";

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function placed(node, left, width) {
  node.style.left = `${left}%`;
  if (width !== undefined) node.style.width = `${width}%`;
  return node;
}

function bar(cls, from, width, scale) {
  return placed(el("div", {class: "bar " + cls}), from * scale, Math.max(width * scale, 0.4));
}

function render(runId, data) {
  const run = data.run, body = document.querySelector("#waterfall tbody");
  const status = document.getElementById("status");
  status.textContent = run.status;
  status.className = "status " + run.status;
  const receipt = document.getElementById("receipt");  // present when receipts are on
  if (receipt) receipt.hidden = !["succeeded", "failed", "cancelled"].includes(run.status);
  document.getElementById("summary").textContent =
    `${data.rows.length} steps, ${data.duration_s.toFixed(2)}s, ` +
    `${run.input_tokens + run.output_tokens} tokens, $${Number(run.cost_usd).toFixed(6)}`;
  const scale = 100 / Math.max(data.duration_s, 0.001);
  body.replaceChildren();
  for (const row of data.rows) {
    const tr = el("tr", {"data-step": row.step_id});
    tr.append(el("td", {}, row.step_id + (row.attempts > 1 ? ` (attempt ${row.attempts})` : "")));
    tr.append(el("td", {class: "status " + row.status}, row.status));
    const lane = el("div", {class: "lane"});
    const start = row.started_at || 0;
    lane.append(bar("queue", row.ready_at || 0, row.queue_s, scale));
    lane.append(bar(row.status === "failed" ? "failed" : "run", start, row.run_s, scale));
    if (row.wait_s > 0) lane.append(bar("wait", start + row.run_s, row.wait_s, scale));
    for (const r of row.retries) lane.append(placed(el("div", {class: "mark retry",
                                                             title: `retry after attempt ${r.attempt}: ${r.error}`}),
                                                    r.at * scale));
    if (row.anomalies.length) lane.append(placed(el("div", {class: "mark anomaly",
                                                           title: "anomaly: " + row.anomalies.join(", ")}),
                                                 start * scale));
    const timeline = el("td", {});
    timeline.append(lane);
    tr.append(timeline);
    tr.append(el("td", {}, row.queue_s.toFixed(3) + "s"));
    tr.append(el("td", {}, row.run_s.toFixed(3) + "s"));
    tr.append(el("td", {}, row.wait_s ? row.wait_s.toFixed(3) + "s" + (row.waiting_for ? ` (${row.waiting_for})` : "") : ""));
    tr.append(el("td", {}, String(row.input_tokens + row.output_tokens)));
    tr.append(el("td", {}, "$" + Number(row.cost_usd).toFixed(6)));
    const actions = el("td", {});
    if (row.child_run_id) actions.append(el("a", {href: "/runs/" + encodeURIComponent(row.child_run_id)},
                                            "child run"));
    if (row.pending_approval) {
      for (const decision of ["approve", "reject"]) {
        const button = el("button", {"data-decision": decision}, decision);
        button.addEventListener("click", () => decide(runId, row.step_id, decision, row.approval_hash));
        actions.append(button);
      }
    }
    tr.append(actions);
    body.append(tr);
  }
  const markers = document.getElementById("markers");
  markers.textContent = data.markers.map(m => m.kind === "recovery"
      ? `re-driven at ${m.at.toFixed(2)}s (generation ${m.generation}: ${m.resumed_steps.join(", ")})`
      : m.kind === "anomaly_detected"
        ? `anomaly ${m.anomaly}${m.step_id ? " on " + m.step_id : ""} at ${m.at.toFixed(2)}s: ${m.message}`
        : `${m.kind} ${m.step_id || ""} at ${m.at.toFixed(2)}s`).join(" · ");
}

async function refresh(runId) {
  const reply = await fetch(`/v1/runs/${encodeURIComponent(runId)}/waterfall`, {credentials: "same-origin"});
  if (reply.ok) render(runId, await reply.json());
}

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

async function decide(runId, stepId, decision, hash) {
  // The cookie alone does not authorize a change: the page's CSRF token goes along (docs/api.md).
  await fetch(`/v1/runs/${encodeURIComponent(runId)}/steps/${encodeURIComponent(stepId)}/${decision}`, {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfToken()},
    body: JSON.stringify({comment: "from the dashboard", approval_hash: hash})});
  refresh(runId);
}

function startWaterfall(runId) {
  refresh(runId);
  let pending = null;
  const source = new EventSource(`/v1/runs/${encodeURIComponent(runId)}/events`);
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
