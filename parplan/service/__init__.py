"""Planning service: FastAPI app, DB models and repositories, API schemas, routes, auth.

Never runs a solver in the request path; jobs go through :mod:`parplan.workers`.
"""
