#!/usr/bin/env python3
"""An S3 server for benchmarks: moto's (PyPI moto[server]), in memory, with a fixed latency
added before every answer, like an object store across a network (first byte after
--latency; many requests wait at once, as they do on a real store).

    s3-server.py --port 9000 --latency 20ms

This machine's kernel has no netem to delay loopback traffic, so the delay is the server's.
Run it with the python of the venv that has moto (scripts/test.sh installs one into
target/moto)."""
import argparse
import time

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import WSGIRequestHandler, run_simple


def seconds(text):
    for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


class Delayed:
    """WSGI middleware: waits `latency` seconds before the app answers."""

    def __init__(self, app, latency):
        self.app, self.latency = app, latency

    def __call__(self, environ, start_response):
        if self.latency:
            time.sleep(self.latency)
        return self.app(environ, start_response)


class Quiet(WSGIRequestHandler):
    # HTTP/1.1 keeps connections open between requests, as S3 does.
    protocol_version = "HTTP/1.1"

    def log_request(self, *args, **kwargs):
        pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9000)
    p.add_argument("--latency", default="20ms", help="added before each answer (e.g. 20ms)")
    a = p.parse_args()
    app = Delayed(DomainDispatcherApplication(create_backend_app), seconds(a.latency))
    run_simple(a.host, a.port, app, threaded=True, request_handler=Quiet)


if __name__ == "__main__":
    main()
