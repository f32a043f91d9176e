#!/bin/bash
# Canonical Terminal-Bench 2 shape, offline: Debian's pytest instead of uvx.
# The service the agent started is what gets scored, so nothing is started here.

mkdir -p /logs/verifier

python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
