"""The progress callback the searches report through: ``report(stage, fraction)``, with a short
stage name and the fraction of the work done (0..1). The service writes it to the job row."""

from __future__ import annotations

from collections.abc import Callable

ProgressFn = Callable[[str, float], None]
