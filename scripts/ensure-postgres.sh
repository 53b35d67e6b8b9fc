#!/usr/bin/env bash
# Make sure the PostgreSQL server the tests use answers on 127.0.0.1:5432 with a `test`
# database that user `postgres` can reach without a password. Starts the cluster when it
# is installed but down; installs it from Debian's packages when it is missing (root only).
set -euo pipefail

HOST=${PGHOST_TEST:-127.0.0.1}
PORT=${PGPORT_TEST:-5432}

say() { echo "ensure-postgres: $*"; }

ready() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -h "$HOST" -p "$PORT"
  else
    (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null
  fi
}

start_cluster() {
  local version
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  [ -n "$version" ] || return 1
  say "starting PostgreSQL $version"
  pg_ctlcluster --skip-systemctl-redirect "$version" main start || return 1
}

install_postgres() {
  [ "$(id -u)" = 0 ] || { say "PostgreSQL is not installed and this is not root: install it, or set FLEETSCOPE_TEST_POSTGRES_URL"; exit 1; }
  say "installing PostgreSQL from Debian's packages"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  local version hba
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  hba=/etc/postgresql/$version/main/pg_hba.conf
  # local tests only: trust loopback connections, as on the project's machines
  grep -q '^host all all 127.0.0.1/32 trust' "$hba" || sed -i '1i host all all 127.0.0.1/32 trust' "$hba"
}

if ! ready; then
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    install_postgres
  fi
  start_cluster || { say "could not start PostgreSQL"; exit 1; }
  for _ in $(seq 1 30); do ready && break; sleep 1; done
  ready || { say "PostgreSQL did not come up on $HOST:$PORT"; exit 1; }
fi

if command -v psql >/dev/null 2>&1; then
  if ! psql -h "$HOST" -p "$PORT" -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
    say "creating database test"
    psql -h "$HOST" -p "$PORT" -U postgres -d postgres -qc "CREATE DATABASE test"
  fi
fi
say "PostgreSQL ready on $HOST:$PORT"
