# The lab's image: every role (rmq-namesrv, rmq-broker, rmq-producer, rmq-consumer, rmq-admin) from one
# install of the package into a virtual environment. The analysis (pyspark, Java) stays on the host.
#
#   docker build -t rocketmq-rebalance-lab .                  # from the usual Python image
#   bash scripts/docker/build_image.sh                        # anywhere, offline: see the README
#
# BASE_IMAGE is any image with Python 3.11+ as python3 and its venv module (the default, or a Debian
# bookworm built by scripts/docker/base_image.sh where no registry is reachable). With wheels/ holding
# the dependencies and the build backend as wheels (scripts/docker/build_image.sh makes them), the build
# needs no network. Either way the package itself is built from the sources copied here, so what the
# image runs is exactly these COPY lines (and the source digest below covers them).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/rmqlab \
    PATH=/opt/rmqlab/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The roles run as an unprivileged user of their own, rmqlab (10001:10001), which owns /runs (a named
# or anonymous volume there starts out as its). `--user UID:GID` (the compose file's RMQ_USER, the
# docker backend's host user) overrides it so that files in a bind-mounted host folder are that user's.
# Network faults need no privilege inside: iptables and tc run from the host, in the container's
# network namespace (nsenter). Created first: this layer stays cached when the sources change.
RUN groupadd --gid 10001 rmqlab \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin rmqlab \
    && mkdir -p /runs \
    && chown 10001:10001 /runs

WORKDIR /lab
# The dependencies first, in a layer of their own: a change of the sources does not reinstall them.
# pyproject.toml keeps the sources of this COPY from being empty when there is no wheels/ (the
# classic builder refuses a COPY that matches nothing); only *.whl files are looked at below.
COPY pyproject.toml wheels* ./wheels/
RUN python3 -m venv "$VIRTUAL_ENV" \
    && if ls wheels/*.whl >/dev/null 2>&1; then \
         pip install --no-index wheels/*.whl; \
       fi \
    && rm -rf wheels

COPY pyproject.toml README.md LICENSE ./
COPY rmqlab ./rmqlab
COPY protocol ./protocol
COPY broker ./broker
COPY client ./client
COPY lab ./lab
COPY chaos ./chaos
COPY pipeline ./pipeline
COPY sim ./sim
COPY proxy ./proxy
COPY interop ./interop
COPY sweeps ./sweeps
# With the wheels installed above, the package builds with the venv's own setuptools and needs nothing
# more; without them, pip fetches the build backend and the dependencies from the index.
RUN if pip show setuptools wheel msgpack >/dev/null 2>&1; then \
         pip install --no-index --no-deps --no-build-isolation .; \
       else \
         pip install .; \
       fi \
    && cd / && rm -rf /lab
# The sources go once installed: a `python -m rmqlab.<role>` started in a folder that holds the source
# tree's rmqlab/ would import that partial package instead of the installed one.
WORKDIR /runs
USER 10001:10001

# Which sources the image was built from: rmq-chaos refuses an image whose digest is not the checkout's.
ARG SOURCE_DIGEST=unknown
LABEL org.rocketmq-rebalance-lab.source-digest=${SOURCE_DIGEST}

VOLUME ["/runs"]
CMD ["rmq-chaos", "list"]
