# Talks to the service the agent left running on port 8000.
import urllib.error
import urllib.request
import uuid
from pathlib import Path

BASE = "http://127.0.0.1:8000"


def request(method, path, body=None):
    req = urllib.request.Request(BASE + path, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_program_exists():
    assert Path("/app/server.py").is_file()


def test_health():
    assert request("GET", "/health") == (200, b"ok")


def test_put_then_get():
    key = "k-" + uuid.uuid4().hex
    status, _ = request("PUT", f"/kv/{key}", b"value \x00\xff bytes")
    assert status == 201
    assert request("GET", f"/kv/{key}") == (200, b"value \x00\xff bytes")


def test_overwrite():
    request("PUT", "/kv/same_key", b"first")
    request("PUT", "/kv/same_key", b"second")
    assert request("GET", "/kv/same_key") == (200, b"second")


def test_missing_key_is_404():
    status, _ = request("GET", "/kv/never-" + uuid.uuid4().hex)
    assert status == 404
