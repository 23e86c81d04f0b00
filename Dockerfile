# The operator image the chart runs by default (image.repository=tsoracle, tag=appVersion): the
# core, the operator extra and the iceberg extra (the operator runs spec.catalog's pods from this
# image); no Spark, no dashboards tooling. The recipe is
# tools/images/images.toml, which builds the same image without Docker for the dev cluster;
# tests/test_images.py fails when this file and that recipe disagree.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md /src/
COPY tsoracle /src/tsoracle
# The venv gets no pip: Debian's pip wheel (from python3-venv) installs into it from outside.
# No .pyc files: a third of the venv, for about a second at start-up.
RUN python3 -m venv --without-pip /opt/tsoracle \
 && /opt/tsoracle/bin/python "$(ls /usr/share/python-wheels/pip-*.whl)/pip" install \
      --no-cache-dir --no-compile "/src[operator,iceberg]" \
 && rm -rf /src
RUN groupadd --gid 65532 tsoracle \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tsoracle
ENV PATH=/opt/tsoracle/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 65532:65532
ENTRYPOINT ["tsoracle"]
CMD ["operator"]
