"""The `pal` command (pal.cli.app), its progress rendering and the demo."""
