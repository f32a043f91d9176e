# Runs the fixed /app/wordcount.py on inputs it has never seen and compares
# with counts computed here.
import subprocess
from pathlib import Path

import pytest

PROGRAM = "/app/wordcount.py"
CASES = {
    "plain.txt": b"one two three\nfour five\n",
    "no-final-newline.txt": b"alpha beta\ngamma",
    "spaces.txt": b"  lots   of\t\tspace  \n\n\n  here \n",
    "utf8.txt": "na\u00efve r\u00e9sum\u00e9 \u2014 ok\n".encode(),
    "empty.txt": b"",
}


def expected(data, name):
    lines = data.count(b"\n")
    words = len(data.split())
    return f"{lines} {words} {len(data)} {name}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_wc(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(CASES[name])
    out = subprocess.run(["python3", PROGRAM, str(path)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected(CASES[name], str(path))


def test_sample_still_there():
    assert Path("/app/sample.txt").is_file()
