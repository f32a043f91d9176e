#!/bin/bash
# Plain-shell verifier: checks /app/deploy.conf against the values the task
# passes in [verifier.env], and writes the reward.

mkdir -p /logs/verifier

fail() {
  echo "FAIL: $*"
  echo 0 > /logs/verifier/reward.txt
  exit 0
}

[ -n "${EXPECTED_RELEASE:-}" ] || fail "EXPECTED_RELEASE not set ([verifier.env] missing)"
[ -n "${EXPECTED_PORT:-}" ] || fail "EXPECTED_PORT not set ([verifier.env] missing)"
[ -n "${DEPLOY_ENV:-}" ] || fail "DEPLOY_ENV not set ([environment.env] missing)"
[ -f /app/deploy.conf ] || fail "/app/deploy.conf missing"

expected=$(printf 'release=%s\nport=%s\nenvironment=%s' \
  "$EXPECTED_RELEASE" "$EXPECTED_PORT" "$DEPLOY_ENV")
[ "$(cat /app/deploy.conf)" = "$expected" ] || fail "deploy.conf content differs"

[ -L /app/current.conf ] || fail "/app/current.conf is not a symlink"
[ "$(readlink -f /app/current.conf)" = /app/deploy.conf ] || fail "current.conf points elsewhere"

echo "PASS"
echo 1 > /logs/verifier/reward.txt
