// The step panel: what GET /v1/runs/{id}/steps/{step} returns of one step (its node's definition,
// output, error and traceback, attempts with idempotency keys, dead time, receipts, approval),
// every value as text (pretty JSON in <pre>), never as markup.
"use strict";

let panelStep = null;

function section(title, ...children) {
  const box = el("section", {class: "panel-section"});
  box.append(el("h3", {}, title), ...children);
  return box;
}

function table(headers, rows, id) {
  const t = el("table", {class: "panel-table", id: id});
  const head = el("tr", {});
  for (const h of headers) head.append(el("th", {}, h));
  t.append(head);
  for (const cells of rows) {
    const tr = el("tr", {});
    for (const c of cells) tr.append(el("td", {}, c === null || c === undefined ? "" : String(c)));
    t.append(tr);
  }
  return t;
}

function errorBlock(error) {
  const box = el("div", {id: "panel-error", class: "error-block"});
  if (error && typeof error === "object") {
    box.append(el("p", {class: "error"}, `${error.type || error.code || "error"}: ${error.message || ""}`));
    if (error.traceback) box.append(el("pre", {id: "panel-traceback", class: "traceback"}, String(error.traceback)));
    const rest = Object.fromEntries(Object.entries(error).filter(([k]) => !["type", "message", "traceback"].includes(k)));
    if (Object.keys(rest).length) box.append(el("pre", {}, pretty(rest)));
  } else {
    box.append(el("pre", {}, pretty(error)));
  }
  return box;
}

function renderPanel(runId, step) {
  document.getElementById("panel-title").textContent = `step ${step.step_id}`;
  const body = document.getElementById("panel-body");
  body.replaceChildren();
  body.append(el("p", {id: "panel-status", class: "status " + step.status},
                 step.status + (step.skip_reason ? ` (${step.skip_reason})` : "")));
  if (step.error) body.append(section("Error", errorBlock(step.error)));
  const input = section("Input");
  input.append(el("p", {class: "muted"}, step.input_note));
  input.append(el("pre", {id: "panel-node"}, step.node ? pretty(step.node) : "(no node of the plan)"));
  body.append(input);
  body.append(section("Output", el("pre", {id: "panel-output"}, pretty(step.output))));
  body.append(section("Attempts", table(
      ["attempt", "generation", "worker", "started", "ended", "outcome", "error", "idempotency key"],
      step.attempts.map(a => [a.attempt, a.generation, a.worker, seconds(a.started_at), seconds(a.ended_at),
                              a.outcome, a.error ? `${a.error.type || ""} ${a.error.message || ""}` : "",
                              a.idempotency_key]), "panel-attempts")));
  if (step.dead.length) {
    body.append(section("Dead time", table(["from", "recovered at", "new generation"],
        step.dead.map(d => [seconds(d.from), seconds(d.to), d.generation]), "panel-dead")));
  }
  if (step.idempotency_key) {
    body.append(section("Idempotency key", el("code", {id: "panel-key"}, step.idempotency_key)));
  }
  if (step.receipts.length) {
    body.append(section("Side-effect receipts", table(["key", "attempt", "kind", "target", "status", "response"],
        step.receipts.map(r => [r.idempotency_key, r.attempt, r.effect_kind, r.target, r.status,
                                JSON.stringify(r.response)]), "panel-receipts")));
  }
  if (step.approval) {
    const a = step.approval;
    const box = section("Approval", el("p", {}, String(a.prompt ?? "")), el("pre", {}, pretty(a.show)),
                        el("p", {}, "hash " + (a.approval_hash || "")));
    if (a.decision) box.append(el("p", {id: "panel-decision"}, `${a.decision} by ${a.by}` + (a.comment ? `: ${a.comment}` : "")));
    body.append(box);
  }
  if (step.child_run_id) {
    body.append(section("Child run", el("a", {href: "/runs/" + encodeURIComponent(step.child_run_id)}, step.child_run_id)));
  }
}

async function openPanel(runId, stepId) {
  panelStep = stepId;
  const reply = await fetch(runPath(runId, `/steps/${encodeURIComponent(stepId)}`), {credentials: "same-origin"});
  const panel = document.getElementById("panel");
  if (!reply.ok) {
    document.getElementById("panel-title").textContent = `step ${stepId}`;
    document.getElementById("panel-body").replaceChildren(el("p", {class: "error"}, `cannot load: ${reply.status}`));
  } else if (panelStep === stepId) {
    renderPanel(runId, await reply.json());
  }
  panel.hidden = false;
}

function refreshPanel(runId) {
  if (panelStep !== null && !document.getElementById("panel").hidden) openPanel(runId, panelStep);
}

document.getElementById("panel-close").addEventListener("click", () => {
  document.getElementById("panel").hidden = true;
  panelStep = null;
});
