# parplan: planner CLI and (from the service extras on) the planning service.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY parplan ./parplan
RUN pip install --disable-pip-version-check '.[search]' \
    && useradd --system --uid 10001 parplan
USER parplan

ENTRYPOINT ["parplan"]
CMD ["models"]
