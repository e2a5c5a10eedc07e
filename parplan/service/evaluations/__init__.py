"""``POST /v1/evaluations``: price a trainer's own configuration (one evaluation, no search)."""
