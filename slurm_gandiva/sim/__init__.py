"""Trace-driven simulator: the same policy objects as the controller, over a simulated cluster.

- `trace`: Philly and our own CSV/JSON trace loaders.
- `models`: job speed on any placement from the Pollux step-time tables.
- `engine`: the discrete-event loop (`Simulator`, `SimConfig`, `Overheads`).
- `metrics`, `plots`: summaries, tables, JSON/CSV and PNG output.
- `cli`: `gandiva simulate`.
"""
