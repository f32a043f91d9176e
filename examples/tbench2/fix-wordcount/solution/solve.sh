#!/bin/bash
set -euo pipefail

cat > /app/wordcount.py <<'PY'
#!/usr/bin/env python3
"""Print line, word and byte counts of one file, like wc."""
import sys


def count(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n"), len(data.split()), len(data)


def main():
    if len(sys.argv) != 2:
        print("usage: wordcount.py FILE", file=sys.stderr)
        return 2
    lines, words, size = count(sys.argv[1])
    print(f"{lines} {words} {size} {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
