"""Process tests: real jobs and child processes (DDP, the probe's sidecar, `bsmon run`, the CLI)."""
