"""What a PAL process needs to run steps: settings, the journal, parsed graphs, a publisher."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from functools import cached_property

from pal import builtin_tools  # noqa: F401  (registers the built-in tools)
from pal.config import Settings
from pal.database import shared_engine
from pal.graph import Graph, parse_graph
from pal.journal import Journal, RunRecord
from pal.tools import load_tool_modules

Publish = Callable[[str, str, int], None]
"""publish(run_id, step_id, generation): ring the doorbell for one step."""

_GRAPH_CACHE_SIZE = 256


class Runtime:
    def __init__(self, settings: Settings, publish: Publish) -> None:
        self.settings = settings
        self.publish = publish
        self._graphs: dict[str, Graph] = {}
        load_tool_modules(settings.tool_modules)

    @cached_property
    def journal(self) -> Journal:
        return Journal(shared_engine(self.settings.database_url))

    @property
    def worker_id(self) -> str:
        # Computed per call: a forked pool process must not report its parent's pid.
        return f"{socket.gethostname()}:{os.getpid()}"

    def graph_of(self, run: RunRecord) -> Graph:
        """The run's graph snapshot, parsed once per process (keyed by its hash)."""
        key = run.graph_hash or ""
        graph = self._graphs.get(key)
        if graph is None:
            graph = parse_graph(run.graph)
            if len(self._graphs) >= _GRAPH_CACHE_SIZE:
                self._graphs.pop(next(iter(self._graphs)))
            self._graphs[key] = graph
        return graph
