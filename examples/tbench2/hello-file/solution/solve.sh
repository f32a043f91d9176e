#!/bin/bash
set -euo pipefail

printf 'Hello, Terminal-Bench!\n' > /app/greeting.txt
chmod 0444 /app/greeting.txt
