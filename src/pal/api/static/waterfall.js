// The run waterfall: fetch the rows the server computes from the journal, redraw on every journal
// event that arrives over SSE (the same-origin cookie authenticates both).
"use strict";

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function bar(cls, from, width, scale) {
  return el("div", {class: "bar " + cls, style: `left:${from * scale}%;width:${Math.max(width * scale, 0.4)}%`});
}

function render(runId, data) {
  const run = data.run, body = document.querySelector("#waterfall tbody");
  const status = document.getElementById("status");
  status.textContent = run.status;
  status.className = "status " + run.status;
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
    for (const r of row.retries) lane.append(el("div", {class: "mark retry", style: `left:${r.at * scale}%`,
                                                        title: `retry after attempt ${r.attempt}: ${r.error}`}));
    const timeline = el("td", {});
    timeline.append(lane);
    tr.append(timeline);
    tr.append(el("td", {}, row.queue_s.toFixed(3) + "s"));
    tr.append(el("td", {}, row.run_s.toFixed(3) + "s"));
    tr.append(el("td", {}, row.wait_s ? row.wait_s.toFixed(3) + "s" + (row.waiting_for ? ` (${row.waiting_for})` : "") : ""));
    tr.append(el("td", {}, String(row.input_tokens + row.output_tokens)));
    tr.append(el("td", {}, "$" + Number(row.cost_usd).toFixed(6)));
    const actions = el("td", {});
    if (row.child_run_id) actions.append(el("a", {href: "/runs/" + row.child_run_id}, "child run"));
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
      : `${m.kind} ${m.step_id || ""} at ${m.at.toFixed(2)}s`).join(" · ");
}

async function refresh(runId) {
  const reply = await fetch(`/v1/runs/${encodeURIComponent(runId)}/waterfall`, {credentials: "same-origin"});
  if (reply.ok) render(runId, await reply.json());
}

async function decide(runId, stepId, decision, hash) {
  await fetch(`/v1/runs/${encodeURIComponent(runId)}/steps/${encodeURIComponent(stepId)}/${decision}`, {
    method: "POST", credentials: "same-origin", headers: {"Content-Type": "application/json"},
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
