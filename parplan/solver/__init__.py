"""Pure planning library: graph IR, frontends, cost models, searches.

Imports nothing from ``parplan.service``, ``parplan.workers`` or ``parplan.agent``.
"""

SOLVER_VERSION = "0.1.0"
