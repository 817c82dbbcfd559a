#!/bin/sh
# What the official image's entrypoint does with POSTGRES_USER/PASSWORD/DB, for a first start only.
set -e
chown -R postgres:postgres "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    echo "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    runuser -u postgres -- initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile --encoding=UTF8 --locale=C.UTF-8 --auth-host=scram-sha-256 --auth-local=trust
    rm /tmp/pwfile
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -w start -o "-c listen_addresses=''"
    runuser -u postgres -- createdb -U "$POSTGRES_USER" "$POSTGRES_DB" 2>/dev/null || true
    runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop
fi
exec runuser -u postgres -- "$@"
