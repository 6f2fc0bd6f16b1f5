#!/bin/sh
# The secrets docker-compose.yml reads, new random ones on every call:
#   sh deploy/make-env.sh > .env && chmod 600 .env
# (docs/security.md). Keep .env out of version control; rotating one means updating the service
# that holds it too (the Postgres roles' passwords live in its data volume once initialised).
set -eu
random() { od -An -N24 -tx1 /dev/urandom | tr -d ' \n'; }
echo "PAL_POSTGRES_PASSWORD=$(random)"
echo "PAL_APP_DB_PASSWORD=$(random)"
echo "PAL_REDIS_PASSWORD=$(random)"
echo "PAL_FLOWER_BASIC_AUTH=admin:$(random)"
