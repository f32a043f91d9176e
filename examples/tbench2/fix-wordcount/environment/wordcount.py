#!/usr/bin/env python3
"""Print line, word and byte counts of one file, like wc."""
import sys


def count(path):
    with open(path, "r") as f:
        text = f.read()
    lines = len(text.split("\n"))
    words = len(text.split(" "))
    size = len(text)
    return lines, words, size


def main():
    if len(sys.argv) != 2:
        print("usage: wordcount.py FILE", file=sys.stderr)
        return 2
    lines, words, size = count(sys.argv[1])
    print(f"{lines} {words} {size} {sys.argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
