# strata's edge image: an edge node (`strata edge run`: MQTT link, policy cache, onnxruntime); no torch.
# Built from the repository root, through the same install path as scripts/setup.sh:
#
#   docker build -f docker/edge.Dockerfile -t strata-edge:0.1.0 .
#
# It cannot be built on the project's machines (no container runtime); tests/test_dockerfiles.py lints it.
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    STRATA_VENV=/opt/strata \
    STRATA_EXTRAS=edge \
    STRATA_EDITABLE=0 \
    STRATA_BROKER=skip

WORKDIR /src
COPY pyproject.toml README.md ./
COPY scripts/setup.sh scripts/setup.sh
COPY cloud cloud
COPY device device
COPY edge edge
COPY functions functions
COPY infra infra

RUN scripts/setup.sh \
    && rm -rf /root/.cache /src/build \
    && groupadd --gid 10001 strata \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin strata

ENV PATH=/opt/strata/bin:$PATH HOME=/tmp
WORKDIR /tmp
USER 10001:10001
CMD ["strata", "edge", "run", "--help"]
