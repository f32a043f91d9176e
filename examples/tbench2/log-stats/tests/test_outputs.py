# Grades /app/report.json key by key. Under pytest each key is one test; run
# as a script it writes /logs/verifier/reward.json (one 0/1 per key) and
# /logs/verifier/ctrf.json.
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

LOG = Path("/app/access.log")
REPORT = Path("/app/report.json")
LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "(\S+) (\S+) [^"]*" (\d{3}) \S+$')


def truth():
    ips, paths, statuses, total = set(), Counter(), Counter(), 0
    for line in LOG.read_text().splitlines():
        m = LINE.match(line)
        assert m, f"unparseable log line: {line!r}"
        total += 1
        ips.add(m.group(1))
        paths[m.group(3)] += 1
        statuses[m.group(4)] += 1
    return {
        "total_requests": total,
        "unique_ips": len(ips),
        "top_path": paths.most_common(1)[0][0],
        "status_counts": dict(statuses),
    }


def report():
    return json.loads(REPORT.read_text())


def check(key):
    assert report().get(key) == truth()[key], f"{key} is wrong"


def test_total_requests():
    check("total_requests")


def test_unique_ips():
    check("unique_ips")


def test_top_path():
    check("top_path")


def test_status_counts():
    check("status_counts")


TESTS = [test_total_requests, test_unique_ips, test_top_path, test_status_counts]


def main():
    out = Path("/logs/verifier")
    out.mkdir(parents=True, exist_ok=True)
    rewards, results, start = {}, [], time.time()
    for test in TESTS:
        key = test.__name__[len("test_"):]
        try:
            test()
            rewards[key], status, msg = 1, "passed", ""
        except Exception as err:  # a missing or malformed report fails the key
            rewards[key], status, msg = 0, "failed", f"{type(err).__name__}: {err}"
        print(f"{status.upper():7} {test.__name__} {msg}")
        results.append({"name": test.__name__, "status": status, "duration": 0,
                        "message": msg})
    summary = {"tests": len(results),
               "passed": sum(r["status"] == "passed" for r in results),
               "failed": sum(r["status"] == "failed" for r in results),
               "pending": 0, "skipped": 0, "other": 0,
               "start": int(start * 1000), "stop": int(time.time() * 1000)}
    ctrf = {"results": {"tool": {"name": "test_outputs.py"}, "summary": summary,
                        "tests": results}}
    (out / "ctrf.json").write_text(json.dumps(ctrf, indent=2) + "\n")
    (out / "reward.json").write_text(json.dumps(rewards) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
