#!/usr/bin/env bash
# `make down`: stops what tools/up.sh started, by the pid files in .state/up/ — Airflow's triggerer, dag-processor,
# scheduler and api-server (each was started as its own process group, so its workers stop with it), then the
# PostgreSQL keeper (which stops the embedded server) and the sandbox (`kvfleet sandbox down`). A pid file whose
# process is not the one up.sh started (another command line) is left alone and reported. Exits 1 if anything
# up.sh started is still running afterwards.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
UP="${KVFLEET_STATE_DIR:-$ROOT/.state}/up"
TIMEOUT="${KVFLEET_DOWN_TIMEOUT:-30}"
status=0

alive() { [ -e "/proc/$1" ] && ! grep -q '^[^)]*) [ZX]' "/proc/$1/stat" 2>/dev/null; }
group_alive() { [ -n "$(ps -o pid= -g "$1" 2>/dev/null | head -1)" ]; }
ours() {  # pid, expected command-line fragment
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -Eq -- "$2"
}

stop() {  # name, command-line fragment that identifies it
  local name="$1" marker="$2" pidfile="$UP/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid="$(cat "$pidfile")"
  if ! [[ "$pid" =~ ^[0-9]+$ ]]; then
    echo "down: $pidfile holds '$pid', not a pid; removed it" >&2; rm -f "$pidfile"; return 0
  fi
  if ! alive "$pid" && ! group_alive "$pid"; then
    rm -f "$pidfile"; return 0
  fi
  if alive "$pid" && ! ours "$pid" "$marker"; then
    echo "down: pid $pid in $pidfile is not $name (its command line lacks '$marker'); not signalling it" >&2
    status=1; return 0
  fi
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 $((TIMEOUT * 5))); do
    group_alive "$pid" || break
    sleep 0.2
  done
  if group_alive "$pid"; then
    echo "down: $name (process group $pid) ignored SIGTERM for ${TIMEOUT}s; killing it" >&2
    kill -KILL -- "-$pid" 2>/dev/null
    sleep 0.5
  fi
  if group_alive "$pid"; then
    echo "down: $name (process group $pid) is still running" >&2; status=1
  else
    echo "stopped $name (pid $pid)"; rm -f "$pidfile"
  fi
}

if [ ! -d "$UP" ]; then
  echo "nothing to stop: no $UP"; exit 0
fi
stop triggerer "airflow triggerer"
stop dag-processor "airflow dag[-_]processor"
stop scheduler "airflow scheduler"
stop api-server "airflow api[-_]server"
stop pg-keeper "python - $UP"
if [ -f "$UP/sandbox/sandbox.pid" ] || [ -f "$UP/sandbox/ports.json" ]; then
  "$ROOT/.venv/bin/kvfleet" sandbox down --state-dir "$UP/sandbox" || status=1
fi
exit $status
