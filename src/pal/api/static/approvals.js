// Approvals on the run page: each pending approval shows its prompt, its rendered `show` payload
// (pretty JSON, as text) and its hash beside Approve and Reject, with a comment box; a decision
// asks for confirmation in the page's own dialog, then posts {comment, approval_hash} to
// POST /v1/runs/{id}/steps/{step}/approve|reject with the page's CSRF token (docs/api.md). A
// decided approval shows its decision, who decided and the comment.
"use strict";

let approvalsKey = null;

function approvalCard(runId, row, onDecided) {
  const a = row.approval;
  const card = el("div", {class: "approval", id: "approval-" + row.step_id, "data-step": row.step_id});
  card.append(el("h3", {}, `${row.step_id}` + (a.kind && a.kind !== "approval" ? ` (${a.kind})` : "")));
  card.append(el("p", {class: "approval-prompt"}, String(a.prompt ?? "")));
  card.append(el("pre", {class: "approval-show"}, pretty(a.show)));
  const hash = el("p", {class: "muted"}, "approval hash ");
  hash.append(el("code", {class: "approval-hash"}, a.approval_hash || ""));
  card.append(hash);
  if (a.decision) {
    card.classList.add("decided");
    card.append(el("p", {class: "approval-decided"},
                   `${a.decision} by ${a.by}` + (a.comment ? ` — “${a.comment}”` : " (no comment)")));
    return card;
  }
  const comment = el("textarea", {class: "approval-comment", rows: "2", maxlength: "2000",
                                  placeholder: "comment (journaled with the decision)"});
  const error = el("p", {class: "error approval-error"});
  card.append(comment);
  for (const decision of ["approve", "reject"]) {
    const button = el("button", {type: "button", "data-decision": decision}, decision + "…");
    button.addEventListener("click", () => confirmDecision(runId, row.step_id, decision, a, comment.value, error,
                                                          onDecided));
    card.append(button);
  }
  card.append(error);
  return card;
}

function confirmDecision(runId, stepId, decision, approval, comment, error, onDecided) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = `${decision} step ${stepId}?`;
  document.getElementById("confirm-prompt").textContent = String(approval.prompt ?? "");
  document.getElementById("confirm-hash").textContent = approval.approval_hash || "";
  document.getElementById("confirm-comment").textContent = comment || "(none)";
  document.getElementById("confirm-yes").textContent = decision;
  dialog.onclose = async () => {
    if (dialog.returnValue !== "confirm") return;
    // The cookie alone does not authorize a change: the page's CSRF token goes along (docs/api.md).
    const reply = await fetch(runPath(runId, `/steps/${encodeURIComponent(stepId)}/${decision}`), {
      method: "POST", credentials: "same-origin",
      headers: {"Content-Type": "application/json", "X-CSRF-Token": csrfToken()},
      body: JSON.stringify({comment: comment || null, approval_hash: approval.approval_hash})});
    if (!reply.ok) {
      const detail = await reply.json().catch(() => ({}));
      error.textContent = `refused (${reply.status}): ${detail.detail || ""}`;
      return;
    }
    approvalsKey = null;
    onDecided();
  };
  dialog.returnValue = "";
  dialog.showModal();
}

function renderApprovals(runId, rows, onDecided) {
  const shown = rows.filter(r => r.approval && (r.pending_approval || r.approval.decision));
  // Rebuilt only when what is shown changes: a comment being typed survives the live refreshes.
  const key = JSON.stringify(shown.map(r => [r.step_id, r.approval.approval_hash, r.approval.decision || null]));
  if (key === approvalsKey) return;
  approvalsKey = key;
  const box = document.getElementById("approval-list");
  box.replaceChildren(...shown.map(r => approvalCard(runId, r, onDecided)));
  document.getElementById("approvals").hidden = shown.length === 0;
}
