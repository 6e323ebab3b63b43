"""One module per CLI command; each exposes `command(...)` for rcdiag.cli to register."""
