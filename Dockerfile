# parplan: the planning service (API and Celery worker) and the planner CLI, in one image.
#   docker build -t parplan .                          # API + worker (the `service` extra)
#   docker build --build-arg EXTRAS=agent -t parplan-agent .   # the validation agent (torch)
# With no configuration `parplan serve` runs the embedded default (SQLite under /var/lib/parplan,
# in-process executor); docker-compose.yml wires PostgreSQL and Redis instead.
FROM python:3.11-slim

ARG EXTRAS=service
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PARPLAN_DATA_DIR=/var/lib/parplan \
    PARPLAN_HOST=0.0.0.0 \
    PARPLAN_PORT=8000

WORKDIR /app
COPY pyproject.toml README.md ./
COPY parplan ./parplan
RUN pip install --disable-pip-version-check ".[${EXTRAS}]" \
    && useradd --system --uid 10001 --home-dir /var/lib/parplan --create-home parplan
USER parplan
EXPOSE 8000

# The API's liveness; compose gives the worker its own check (`parplan worker --ping`).
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=5 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]

ENTRYPOINT ["parplan"]
CMD ["serve"]
