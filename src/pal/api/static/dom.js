// Helpers the dashboard's scripts share. Under the dashboard's CSP (docs/api.md, "Security
// headers") text goes in with textContent only, never as markup, and positions are set through
// element.style (CSSOM) or SVG attributes, never as a style="" attribute.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined && text !== null) node.textContent = text;
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function pretty(value) {
  return JSON.stringify(value === undefined ? null : value, null, 2);
}

function seconds(t) {
  return t === null || t === undefined ? "" : `+${Number(t).toFixed(3)}s`;
}

function csrfToken() {
  const meta = document.querySelector('meta[name="csrf-token"]');
  return meta ? meta.content : "";
}

function runPath(runId, rest) {
  return `/v1/runs/${encodeURIComponent(runId)}${rest || ""}`;
}
