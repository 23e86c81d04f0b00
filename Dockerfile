# The operator image referenced by charts/tsoracle (image.repository=tsoracle).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tsoracle ./tsoracle
RUN pip install --no-cache-dir . && useradd --uid 65532 --no-create-home tsoracle
USER 65532
ENTRYPOINT ["tsoracle"]
CMD ["operator"]
