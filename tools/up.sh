#!/usr/bin/env bash
# `make up`: a local Airflow service against the kvfleet sandbox (the digital twin) and the embedded PostgreSQL,
# everything on 127.0.0.1. Starts, each in its own process group with a pid file under .state/up/:
#   the sandbox (`kvfleet sandbox up`), a keeper holding the embedded PostgreSQL open (kvfleet history + Airflow
#   metadata), and Airflow's api-server, scheduler, dag-processor and triggerer (LocalExecutor), with the
#   execution API URL and one JWT secret shared by all of them; then prints the URL and the login.
# Nothing listens beyond 127.0.0.1: the scheduler and the triggerer run without their log servers (Airflow 3.3
# binds those to every interface, ports 8793/8794, and has no setting for their address); with the LocalExecutor
# every task runs here and the api-server reads the log files from AIRFLOW_HOME/logs directly.
# `tools/down.sh` (make down) stops them by those pid files. Settings (environment):
#   KVFLEET_UP_PORT (8080), KVFLEET_FLEET (fleet.example.yaml), KVFLEET_STATE_DIR (./.state), KVFLEET_UP_USER (admin).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$ROOT/.venv/bin/python"
STATE_ROOT="${KVFLEET_STATE_DIR:-$ROOT/.state}"
UP="$STATE_ROOT/up"
PORT="${KVFLEET_UP_PORT:-8080}"
FLEET="$(cd "$ROOT" && realpath "${KVFLEET_FLEET:-fleet.example.yaml}")"
USER_NAME="${KVFLEET_UP_USER:-admin}"
export PATH="$ROOT/.tools/bin:$ROOT/.venv/bin:$PATH"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/kvfleet-runtime-$(id -u)}"
# The history is the embedded PostgreSQL, by explicit choice (kvfleet does not fall back to it on its own); the
# environment file written below then names the keeper's server by its URLs.
export KVFLEET_HISTORY_URL=embedded
mkdir -p -m 700 "$XDG_RUNTIME_DIR"

say() { printf '==> %s\n' "$*"; }
fail() { printf 'make up: %s\n' "$*" >&2; exit 1; }

[ -x "$PY" ] || fail "no $PY; run \`make install\` (or \`make demo\`) first"
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65535 ] \
  || fail "KVFLEET_UP_PORT: '$PORT' is not a port from 1024 to 65535; pick a free one, e.g. KVFLEET_UP_PORT=8081"

alive() { [ -n "${1:-}" ] && [ -e "/proc/$1" ] && ! grep -q '^[^)]*) [ZX]' "/proc/$1/stat" 2>/dev/null; }
for name in api-server scheduler dag-processor triggerer pg-keeper; do
  if [ -f "$UP/$name.pid" ] && alive "$(cat "$UP/$name.pid")"; then
    fail "$name is already running (pid $(cat "$UP/$name.pid")); \`make down\` (tools/down.sh) first"
  fi
done
if "$PY" -c "import socket,sys; s=socket.socket(); s.settimeout(0.5); sys.exit(0 if s.connect_ex(('127.0.0.1', $PORT)) == 0 else 1)"; then
  fail "127.0.0.1:$PORT is taken by another program; set KVFLEET_UP_PORT to a free port"
fi
mkdir -p "$UP/logs" "$UP/airflow/plugins"
chmod 700 "$UP"

# ---- the sandbox (its own pid file and `down`) --------------------------------------------------------------
say "starting the sandbox fleet ($(basename "$FLEET")) on 127.0.0.1"
"$ROOT/.venv/bin/kvfleet" sandbox up --fleet "$FLEET" --state-dir "$UP/sandbox"

# ---- the embedded PostgreSQL, held open by a keeper process until down ---------------------------------------
# The embedded server stops when the last process holding it exits; the keeper is that process.
say "starting the embedded PostgreSQL (kvfleet history + Airflow metadata)"
rm -f "$UP/pg.ready"
setsid "$PY" - "$UP" >"$UP/logs/pg-keeper.log" 2>&1 <<'KEEPER' &
import os, signal, sys, threading
from pathlib import Path
from kvfleet.history.db import AIRFLOW_DB, HISTORY_DB, EmbeddedPostgres

up = Path(sys.argv[1])
stop = threading.Event()
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
pg = EmbeddedPostgres(up).start()
try:
    (up / "pg.ready").write_text(f"{pg.url(HISTORY_DB)}\n{pg.url(AIRFLOW_DB)}\n")
    print(f"embedded PostgreSQL ready (socket dir {pg.socket_dir}); keeper pid {os.getpid()}", flush=True)
    while not stop.wait(1.0):
        pass
finally:
    (up / "pg.ready").unlink(missing_ok=True)
    pg.stop()
    print("embedded PostgreSQL stopped", flush=True)
KEEPER
echo $! >"$UP/pg-keeper.pid"
for _ in $(seq 1 600); do
  [ -s "$UP/pg.ready" ] && break
  alive "$(cat "$UP/pg-keeper.pid")" || { tail -20 "$UP/logs/pg-keeper.log" >&2; fail "the PostgreSQL keeper exited"; }
  sleep 0.2
done
[ -s "$UP/pg.ready" ] || fail "the embedded PostgreSQL did not start in 120 s; see $UP/logs/pg-keeper.log"

# ---- one environment for every Airflow process ------------------------------------------------------------
[ -s "$UP/jwt_secret" ] || (umask 077; "$PY" -c "import secrets; print(secrets.token_urlsafe(48))" >"$UP/jwt_secret")
if [ ! -s "$UP/passwords.json" ]; then
  (umask 077; "$PY" -c "import json, secrets, sys; print(json.dumps({sys.argv[1]: secrets.token_urlsafe(12)}))" \
    "$USER_NAME" >"$UP/passwords.json")
fi
PASSWORD="$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$UP/passwords.json" "$USER_NAME")"

"$PY" - "$UP" "$PORT" "$USER_NAME" >"$UP/env" <<'ENV'
import shlex, sys
from pathlib import Path
from kvfleet_local.env import airflow_env

class Ready:  # the keeper's server, seen through the URLs it wrote
    def __init__(self, up: Path) -> None:
        self.history, self.airflow = up.joinpath("pg.ready").read_text().split()
    def url(self, database: str, user: str = "postgres") -> str:  # EmbeddedPostgres.url's signature
        base = self.airflow if database == "airflow" else self.history
        return f"postgresql+psycopg2://{user}@/{database}?{base.split('?', 1)[1]}"

up, port, user = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
env = airflow_env(up / "airflow", Ready(up))  # type: ignore[arg-type]
env.update({
    "AIRFLOW__API__HOST": "127.0.0.1",
    "AIRFLOW__API__PORT": port,
    "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
    "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
    "AIRFLOW__API_AUTH__JWT_SECRET": (up / "jwt_secret").read_text().strip(),
    "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{user}:admin",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(up / "passwords.json"),
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
    "KVFLEET_POLL_SECONDS": "0.2",  # the sandbox's control plane runs on a scaled clock
    "KVFLEET_STATE_DIR": str(up.parent),
    "AIRFLOW_API_URL": f"http://127.0.0.1:{port}",  # `kvfleet gate` answers over the REST API as this user
    "AIRFLOW_API_USER": user,
})
for key, value in sorted(env.items()):
    print(f"export {key}={shlex.quote(value)}")
ENV
echo "export AIRFLOW_API_PASSWORD=$(printf %q "$PASSWORD")" >>"$UP/env"
chmod 600 "$UP/env"
# shellcheck disable=SC1091
source "$UP/sandbox/env"
# shellcheck disable=SC1091
source "$UP/env"
cat "$UP/sandbox/env" >>"$UP/env"

say "migrating Airflow's metadata database"
"$PY" -m airflow db migrate >"$UP/logs/db-migrate.log" 2>&1 || { tail -30 "$UP/logs/db-migrate.log" >&2; fail "airflow db migrate failed"; }

# kvfleet's pools, one per concurrency class of its mutating tasks (kvfleet.airflow.operators.POOLS; a task in a
# pool that does not exist is never scheduled). `airflow pools set` is idempotent; it keeps no deferred slots.
say "creating kvfleet's Airflow pools"
"$PY" -c "from kvfleet.airflow.operators import POOLS
for name, (slots, description) in POOLS.items(): print(name, slots, description, sep='\t')" |
  while IFS=$'\t' read -r pool slots description; do
    "$PY" -m airflow pools set "$pool" "$slots" "$description" >>"$UP/logs/db-migrate.log" 2>&1 \
      || { tail -30 "$UP/logs/db-migrate.log" >&2; fail "airflow pools set $pool failed"; }
    echo "    pool $pool: $slots slots"
  done

start() {  # name, then the command; own process group (down signals the group), output to logs/<name>.log
  local name="$1"; shift
  setsid "$@" </dev/null >"$UP/logs/$name.log" 2>&1 &
  echo $! >"$UP/$name.pid"
  echo "    $name: pid $(cat "$UP/$name.pid"), log $UP/logs/$name.log"
}
say "starting Airflow on 127.0.0.1:$PORT"
start api-server "$PY" -m airflow api-server --host 127.0.0.1 --port "$PORT" --workers 1
start scheduler "$PY" -m airflow scheduler --skip-serve-logs
start dag-processor "$PY" -m airflow dag-processor
start triggerer "$PY" -m airflow triggerer --skip-serve-logs

for _ in $(seq 1 300); do
  if "$PY" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$PORT/api/v2/monitor/health', timeout=2)" 2>/dev/null; then
    break
  fi
  for name in api-server scheduler dag-processor triggerer; do
    alive "$(cat "$UP/$name.pid")" || { tail -30 "$UP/logs/$name.log" >&2; fail "$name exited while starting; \`make down\` cleans up"; }
  done
  sleep 1
done
"$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/api/v2/monitor/health', timeout=2)" 2>/dev/null \
  || fail "the api-server did not answer on 127.0.0.1:$PORT within 5 minutes; see $UP/logs/api-server.log"

cat <<EOF

kvfleet on Airflow is up:
  Airflow UI    http://127.0.0.1:$PORT/
  kvfleet page  http://127.0.0.1:$PORT/kvfleet/fleet   (also "kvfleet" in the UI's navigation)
  login         $USER_NAME / $PASSWORD   (stored in $UP/passwords.json)
  environment   source $UP/env   (then kvfleet audit …, kvfleet gate list, airflow dags trigger …)
  logs          $UP/logs/
The DAGs start paused; unpause kvfleet_rollout in the UI, or trigger it there. Stop everything with \`make down\`.
EOF
