"""Documents to programs: a graph or a plain-LLM spec parsed, validated and interpreted.

Pure: the planner reads documents and answers which steps come next; it never touches storage."""
