# Checks the file the agent was asked to create under /app.
import os
import stat
from pathlib import Path

GREETING = Path("/app/greeting.txt")


def test_file_exists():
    assert GREETING.is_file(), "/app/greeting.txt is missing"


def test_content_is_exact():
    assert GREETING.read_bytes() == b"Hello, Terminal-Bench!\n"


def test_mode_is_read_only():
    mode = stat.S_IMODE(os.stat(GREETING).st_mode)
    assert mode == 0o444, f"mode is {oct(mode)}"
