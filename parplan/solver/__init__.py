"""Pure planning library: graph IR, frontends, cost models, searches.

Imports nothing from ``parplan.service``, ``parplan.workers`` or ``parplan.agent``.
"""

#: Part of every plan's cache key (``request.request_hash``): raise it whenever a change can alter a
#: plan document (prices, searches, the document's keys), so that no cached plan outlives the code
#: that made it.
SOLVER_VERSION = "0.4.0"
