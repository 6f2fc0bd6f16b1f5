#!/bin/sh
# Run once by the postgres image when its data volume is new: the role PAL's worker, beat, API and
# Flower connect as. It owns nothing; `pal db grant pal_app` (the compose file's `migrate` service)
# gives it only what they need (docs/security.md).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v app_password="$PAL_APP_DB_PASSWORD" <<'SQL'
CREATE ROLE pal_app LOGIN PASSWORD :'app_password';
SQL
