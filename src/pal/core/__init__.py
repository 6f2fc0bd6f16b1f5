"""The vocabulary and pure rules of PAL: records, clock, step log, retry, limits, templates.

No I/O lives here and nothing here imports another PAL layer but `pal.errors`
(docs/architecture.md, "The map")."""
