# strata's cloud image: the learner (with its parameter server and control endpoint) and hybrid units, with the
# CPU build of torch. Built from the repository root, through the same install path as scripts/setup.sh:
#
#   docker build -f docker/cloud.Dockerfile --build-arg TORCH_INDEX_URL=<index of torch's CPU builds> \
#       -t strata-cloud:0.1.0 .
#
# It cannot be built on the project's machines (no container runtime); tests/test_dockerfiles.py lints it.
FROM python:3.11.7-slim-bookworm

ARG TORCH_INDEX_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    STRATA_VENV=/opt/strata \
    STRATA_EXTRAS=cloud,functions \
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

# torch's CPU build comes from the index named at build time; without one, pip's default index would pull CUDA.
RUN test -n "$TORCH_INDEX_URL" || { echo "pass --build-arg TORCH_INDEX_URL=<index of torch's CPU builds>" >&2; exit 1; } \
    && STRATA_TORCH_INDEX="$TORCH_INDEX_URL" scripts/setup.sh \
    && rm -rf /root/.cache /src/build \
    && groupadd --gid 10001 strata \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin strata

ENV PATH=/opt/strata/bin:$PATH HOME=/tmp
WORKDIR /tmp
USER 10001:10001
CMD ["strata", "--help"]
