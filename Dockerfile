# The operator image referenced by charts/tsoracle (image.repository=tsoracle): the core and
# the operator extra only (no Spark, no dashboards tooling).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tsoracle ./tsoracle
RUN pip install --no-cache-dir ".[operator]" && useradd --uid 65532 --no-create-home tsoracle
USER 65532
ENTRYPOINT ["tsoracle"]
CMD ["operator"]
