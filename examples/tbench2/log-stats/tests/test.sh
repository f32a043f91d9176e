#!/bin/bash
# Partial credit: test_outputs.py grades each key of /app/report.json on its
# own and writes one reward per key to /logs/verifier/reward.json, plus a CTRF
# report, the way the pytest-json-ctrf plugin would.

mkdir -p /logs/verifier

python3 /tests/test_outputs.py
