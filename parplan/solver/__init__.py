"""Pure planning library: graph IR, frontends, cost models, searches.

Imports nothing from ``parplan.service``, ``parplan.workers`` or ``parplan.agent``.
"""

#: Part of every plan's cache key (``request.request_hash``): raise it whenever a change can alter a
#: plan document (prices, searches, the document's keys), so that no cached plan outlives the code
#: that made it. 0.2.0: the memory fixes measured on an H100, the DP's pruning and ``solver.pareto``,
#: the ILP's 0.1% gap and its smaller micro-steps. 0.2.1: the ILP's skipped solves and problems,
#: HiGHS without presolve and restarts (another plan of equal memory in some cases), new
#: ``solver.work`` keys. 0.3.0: targets (the request's ``target``), ``target`` and
#: ``model.architecture`` in every plan document (exports need them: a cached plan without them
#: could not be exported).
SOLVER_VERSION = "0.3.0"
