#!/bin/bash
# RELEASE_NAME and SERVICE_PORT come from [solution.env]; DEPLOY_ENV from
# [environment.env].
set -euo pipefail

: "${RELEASE_NAME:?[solution.env] not applied}"
: "${SERVICE_PORT:?[solution.env] not applied}"

printf 'release=%s\nport=%s\nenvironment=%s\n' \
  "$RELEASE_NAME" "$SERVICE_PORT" "$DEPLOY_ENV" > /app/deploy.conf
ln -sfn /app/deploy.conf /app/current.conf
