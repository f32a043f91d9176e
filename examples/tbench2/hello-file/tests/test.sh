#!/bin/bash
# Canonical Terminal-Bench 2 shape: run the tests, write the reward.
# The published harness installs uv and pytest here; this example uses
# Debian's python3-pytest so it runs offline.

mkdir -p /logs/verifier

python3 -m pytest /tests/test_outputs.py -rA -p no:cacheprovider

if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
