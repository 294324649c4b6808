# stream-ndcg service image: slim, non-root, with a health check on /healthz.
FROM python:3.11.11-slim-bookworm AS build
# A C compiler for the compiled core (mypyc, setup.py; the image has Python's headers); only this
# stage has it, the service's image gets the wheel.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY stream_ndcg ./stream_ndcg
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11.11-slim-bookworm
RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin stream-ndcg
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001
# The source revision shown by stream_ndcg_build_info: docker build --build-arg REVISION=$(git rev-parse HEAD) .
ARG REVISION=unknown
# In a container the metrics must be reachable from Prometheus, not only from loopback.
ENV STREAM_NDCG_METRICS_HOST=0.0.0.0 \
    STREAM_NDCG_METRICS_PORT=9464 \
    STREAM_NDCG_LOG_FORMAT=json \
    PYTHONUNBUFFERED=1 \
    STREAM_NDCG_REVISION=$REVISION
EXPOSE 9464
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz', timeout=2)"]
ENTRYPOINT ["stream-ndcg"]
CMD ["run"]
