#!/usr/bin/env python3
"""An HTTP proxy that puts a network's latency in front of a store's emulator, for
bench-s3.sh with STORE=gcs or azure (fake-gcs-server, Azurite): every request is forwarded
after --latency, and each answer's body sent at most at --pace bytes a second (0: as fast as
it goes), as scripts/s3-server.py does for moto. Keep-alive both ways; one upstream
connection per client connection. Standard library only.

    delay-proxy.py --port 9000 --upstream 127.0.0.1:10000 --latency 20ms [--pace 100M]
"""
import argparse
import http.client
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 256 << 10
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "host"}


def seconds(text):
    for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * scale
    return float(text)


def size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        time.sleep(self.server.latency)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        headers["Host"] = self.server.upstream
        for attempt in range(2):
            if getattr(self, "up", None) is None:
                self.up = http.client.HTTPConnection(self.server.upstream, timeout=120)
            try:
                self.up.request(self.command, self.path, body=body, headers=headers)
                answer = self.up.getresponse()
                data = answer.read()
                break
            except (http.client.HTTPException, OSError):
                self.up.close()
                self.up = None
                if attempt:
                    raise
        self.send_response(answer.status, answer.reason)
        for k, v in answer.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        pace, start = self.server.pace, time.monotonic()
        for i in range(0, len(data), CHUNK):
            self.wfile.write(data[i : i + CHUNK])
            if pace:
                ahead = start + (i + CHUNK) / pace - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="HOST:PORT of the emulator")
    p.add_argument("--latency", default="20ms")
    p.add_argument("--pace", default="0")
    a = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.port), Handler)
    server.daemon_threads = True
    server.upstream, server.latency, server.pace = a.upstream, seconds(a.latency), size(a.pace)
    server.serve_forever()


if __name__ == "__main__":
    main()
