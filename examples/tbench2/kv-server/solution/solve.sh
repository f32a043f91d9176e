#!/bin/bash
set -euo pipefail

cat > /app/server.py <<'PY'
#!/usr/bin/env python3
"""A key-value store over HTTP on port 8000."""
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STORE = {}
KEY = re.compile(r"^/kv/([A-Za-z0-9_-]+)$")


class Handler(BaseHTTPRequestHandler):
    def reply(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, b"ok")
        m = KEY.match(self.path)
        if m and m.group(1) in STORE:
            return self.reply(200, STORE[m.group(1)])
        return self.reply(404)

    def do_PUT(self):
        m = KEY.match(self.path)
        if not m:
            return self.reply(400)
        length = int(self.headers.get("Content-Length", "0"))
        STORE[m.group(1)] = self.rfile.read(length)
        return self.reply(201)

    def log_message(self, fmt, *args):
        pass


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
PY

setsid nohup python3 /app/server.py > /var/log/kv/server.log 2>&1 < /dev/null &

for _ in $(seq 1 100); do
  if python3 -c 'import urllib.request; urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=1)' 2>/dev/null; then
    exit 0
  fi
  sleep 0.1
done
echo "server did not come up" >&2
exit 1
