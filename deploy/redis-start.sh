#!/bin/sh
# Starts redis-server (docker-compose.yml's `redis`) with the password from PAL_REDIS_PASSWORD in a
# config file written here, never on its command line: a process's argv is readable by every user
# of the host (`ps`), its config file and environment are not (docs/security.md).
#   PAL_REDIS_PASSWORD=... sh deploy/redis-start.sh [redis-server options...]
set -eu
conf="${PAL_REDIS_CONF:-/tmp/pal-redis.conf}"
case "${PAL_REDIS_PASSWORD:-}" in
  '' | *[!A-Za-z0-9_-]*)
    echo "PAL_REDIS_PASSWORD must be set, of letters, digits, '-' and '_' (sh deploy/make-env.sh)" >&2
    exit 1 ;;
esac
umask 077
# A here-document: the password reaches `cat` on its input, not as an argument.
cat > "$conf" <<CONF
requirepass $PAL_REDIS_PASSWORD
CONF
unset PAL_REDIS_PASSWORD  # nor in redis-server's environment
exec redis-server "$conf" "$@"
