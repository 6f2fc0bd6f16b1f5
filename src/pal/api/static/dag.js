// The run's graph as an SVG DAG, drawn from the layout the server computes (pal.api.dag): nodes
// at their (x, y), coloured by their step's state through CSS classes, edges as curves with the
// branch they take (sourceHandle). No layout or drawing library.
"use strict";

function drawDag(runId, dag) {
  const box = document.getElementById("dag-box");
  document.getElementById("dag-none").hidden = !!dag;
  const old = document.getElementById("dag");
  if (old) old.remove();
  if (!dag) return;
  const svg = svgEl("svg", {id: "dag", width: dag.width, height: dag.height, viewBox: `0 0 ${dag.width} ${dag.height}`,
                           role: "img", "aria-label": "the run's graph"});
  const defs = svgEl("defs");
  const marker = svgEl("marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
                                  markerHeight: 7, orient: "auto-start-reverse"});
  marker.append(svgEl("path", {d: "M 0 0 L 10 5 L 0 10 z", class: "dag-arrow"}));
  defs.append(marker);
  svg.append(defs);
  const at = Object.fromEntries(dag.nodes.map(n => [n.id, n]));
  const w = dag.node_width, h = dag.node_height;
  for (const e of dag.edges) {
    const s = at[e.source], t = at[e.target];
    const x1 = s.x + w, y1 = s.y + h / 2, x2 = t.x, y2 = t.y + h / 2, mid = (x1 + x2) / 2;
    const dead = t.state === "skipped" ? " dead" : "";
    svg.append(svgEl("path", {d: `M ${x1} ${y1} C ${mid} ${y1}, ${mid} ${y2}, ${x2} ${y2}`,
                              class: "dag-edge" + dead, "marker-end": "url(#arrow)"}));
    if (e.handle) svg.append(svgEl("text", {x: mid, y: (y1 + y2) / 2 - 4, class: "dag-handle"}, String(e.handle)));
  }
  for (const n of dag.nodes) {
    const g = svgEl("g", {class: "dag-node state-" + n.state.replace(" ", "-"), "data-node": n.id,
                          transform: `translate(${n.x} ${n.y})`});
    g.append(svgEl("title", {}, `${n.id} (${n.type}): ${n.state}`));
    g.append(svgEl("rect", {width: w, height: h, rx: 6}));
    g.append(svgEl("text", {x: 8, y: 17, class: "dag-id"}, n.id.length > 20 ? n.id.slice(0, 19) + "…" : n.id));
    g.append(svgEl("text", {x: 8, y: 32, class: "dag-type"}, `${n.type} · ${n.state}`));
    g.addEventListener("click", () => openPanel(runId, n.id));
    svg.append(g);
  }
  box.append(svg);
}
