"""kparity cases: the case model, value distributions, presets, contract cases, strategies.

A family module here (e.g. `cases/norms.py`) registers, per op, a function returning its gate
cases (model presets, tile-window edges, distributions). `cases.generate` combines them with each
impl's contract into valid and violating cases; adding an op family adds one module here.
"""
