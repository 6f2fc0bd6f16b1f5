// Retry and fork on the run page (docs/retry-and-fork.md): Retry… (a failed or cancelled run) and
// Fork… (from a chosen node, with this run's input or a JSON one) each ask for confirmation in the
// page's own dialog, then post to POST /v1/runs/{id}/retry or /fork with the page's CSRF token and
// open the new run's page. The buttons show once the run has finished.
"use strict";

const FINISHED = ["succeeded", "failed", "cancelled"];

function showLineageActions(status) {
  const actions = document.getElementById("lineage-actions");
  if (!actions) return;
  actions.hidden = !FINISHED.includes(status);
  document.getElementById("retry-box").hidden = !["failed", "cancelled"].includes(status);
}

function lineageConfirm(title, text, onConfirm) {
  const dialog = document.getElementById("lineage-confirm");
  document.getElementById("lineage-confirm-title").textContent = title;
  document.getElementById("lineage-confirm-text").textContent = text;
  dialog.onclose = () => { if (dialog.returnValue === "confirm") onConfirm(); };
  dialog.returnValue = "";
  dialog.showModal();
}

async function postLineage(runId, action, body) {
  const error = document.getElementById("lineage-error");
  error.textContent = "";
  const reply = await fetch(runPath(runId, "/" + action), {
    method: "POST", credentials: "same-origin",
    headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfToken()},
    body: JSON.stringify(body)});
  const answer = await reply.json().catch(() => ({}));
  if (!reply.ok) {
    const detail = typeof answer.detail === "string" ? answer.detail : JSON.stringify(answer.detail || "");
    error.textContent = `${action} refused (${reply.status}): ${detail}`;
    return;
  }
  window.location.assign("/runs/" + encodeURIComponent(answer.run_id));
}

function startLineage() {
  const section = document.getElementById("lineage");
  const retry = document.getElementById("retry");
  if (!section || !retry) return;
  const runId = section.dataset.runId;
  retry.addEventListener("click", () => lineageConfirm(
    `Retry run ${runId}?`,
    "A new run with the same graph and input: the completed steps are reused, the failed ones run again.",
    () => postLineage(runId, "retry", {})));
  document.getElementById("fork").addEventListener("click", () => {
    const step = document.getElementById("fork-step").value;
    const text = document.getElementById("fork-input").value.trim();
    const body = {from_step: step};
    if (text) {
      try {
        body.input = JSON.parse(text);
      } catch (exc) {
        document.getElementById("lineage-error").textContent = `the input is not JSON: ${exc.message}`;
        return;
      }
    }
    lineageConfirm(`Fork run ${runId} from ${step}?`,
                   `A new run: the steps before ${step} are reused, ${step} and what follows run again, `
                   + (text ? "with the input given." : "with this run's input."),
                   () => postLineage(runId, "fork", body));
  });
}

startLineage();
