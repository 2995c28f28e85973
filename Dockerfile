# The lab's image: every role (rmq-namesrv, rmq-broker, rmq-producer, rmq-consumer, rmq-admin) from
# one install of the package. Used by docker-compose.yml; the analysis (pyspark, Java) stays outside.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /lab
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY broker ./broker
COPY client ./client
COPY chaos ./chaos
COPY pipeline ./pipeline
RUN pip install . && mkdir -p /runs

VOLUME ["/runs"]
CMD ["rmq-chaos", "list"]
