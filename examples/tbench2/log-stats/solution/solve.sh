#!/bin/bash
set -euo pipefail

python3 - <<'PY'
import json
import re
from collections import Counter

line_re = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "(\S+) (\S+) [^"]*" (\d{3}) \S+$')
ips, paths, statuses, total = set(), Counter(), Counter(), 0
with open("/app/access.log") as f:
    for line in f:
        m = line_re.match(line.rstrip("\n"))
        if not m:
            continue
        total += 1
        ips.add(m.group(1))
        paths[m.group(3)] += 1
        statuses[m.group(4)] += 1

report = {
    "total_requests": total,
    "unique_ips": len(ips),
    "top_path": paths.most_common(1)[0][0],
    "status_counts": dict(statuses),
}
with open("/app/report.json", "w") as f:
    json.dump(report, f, indent=2)
PY
