#!/usr/bin/env bash
# Concurrent appends on a Citus cluster beside the same run on plain PostgreSQL, as
# docs/scaling.md reports them. It starts, in a temporary directory, a Citus coordinator and two
# workers and one plain PostgreSQL server, all from the PostgreSQL installation `pg_config`
# names, with the same settings (fsync, synchronous_commit); then, for each case, runs
# `examples/concurrent_appends` on a fresh Citus database and at once the same run on a fresh
# plain database, ROUNDS times (default 2), and prints each pair's wall times, their ratio, the
# Citus run's two-phase commits (rows Citus logged in pg_dist_transaction, with its recovery
# turned off) and the committers' conflict retries; then the ratios the targets name.
#
#   scripts/citus-bench.sh [ROUNDS]
#   CTXD_BENCH_FSYNC=off scripts/citus-bench.sh      # both engines without fsync
#   CTXD_BENCH_KEEP=1 scripts/citus-bench.sh         # leave the servers running, for a look
#
# Citus must be installed into that PostgreSQL by hand (its `citus.so` in `pg_config
# --pkglibdir`): it is not in the package registries, and nothing here installs it. Run as a
# user that may run initdb; as root the servers run as `postgres`. Everything listens on
# 127.0.0.1 on free ports and is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-2}"
FSYNC="${CTXD_BENCH_FSYNC:-on}"
BIN="$(pg_config --bindir)"
if [[ ! -f "$(pg_config --pkglibdir)/citus.so" ]]; then
    echo "citus-bench: Citus is not installed in $(pg_config --pkglibdir) (see docs/scaling.md)" >&2
    exit 2
fi

AS=()
if [[ "$(id -u)" == 0 ]]; then AS=(runuser -u postgres --); fi
WORK="$(mktemp -d)"
chmod 755 "$WORK"
if [[ ${#AS[@]} -gt 0 ]]; then chown postgres "$WORK"; fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

NAMES=(coordinator worker1 worker2 plain)
declare -A PORT
stop_all() {
    if [[ -n "${CTXD_BENCH_KEEP:-}" ]]; then
        echo "citus-bench: the servers and their logs are kept in $WORK" >&2
        return
    fi
    for name in "${NAMES[@]}"; do
        if [[ -f "$WORK/$name/postmaster.pid" ]]; then
            "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/$name" -m immediate stop >/dev/null 2>&1 || true
        fi
    done
    rm -rf "$WORK"
}
trap stop_all EXIT

for name in "${NAMES[@]}"; do
    PORT[$name]="$(free_port)"
    "${AS[@]}" "$BIN/initdb" -D "$WORK/$name" -U postgres --auth=trust >"$WORK/$name.initdb.log"
    preload=citus
    if [[ "$name" == plain ]]; then preload=''; fi
    cat >>"$WORK/$name/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = ${PORT[$name]}
unix_socket_directories = '$WORK'
shared_preload_libraries = '$preload'
max_connections = 300
# A Citus maintenance daemon per database: one per run and node.
max_worker_processes = 64
shared_buffers = 256MB
fsync = $FSYNC
synchronous_commit = $FSYNC
# Two-phase commits stay in pg_dist_transaction to be counted.
citus.recover_2pc_interval = -1
# No TLS between the nodes, as between ctxd and the plain server (Citus would turn it on).
citus.node_conninfo = 'sslmode=disable'
EOF
    if [[ "$name" == plain ]]; then sed -i '/^citus\./d' "$WORK/$name/postgresql.conf"; fi
    "${AS[@]}" "$BIN/pg_ctl" -D "$WORK/$name" -l "$WORK/$name.log" -w start >/dev/null
done

psql_on() { # NAME DATABASE SQL
    psql -X -q -t -A -h 127.0.0.1 -p "${PORT[$1]}" -U postgres -d "$2" -v ON_ERROR_STOP=1 -c "$3"
}

# A fresh database on every node of the cluster, the workers added to the coordinator's.
citus_db() {
    local db="$1"
    for name in coordinator worker1 worker2; do
        psql_on "$name" postgres "CREATE DATABASE $db"
        psql_on "$name" "$db" "CREATE EXTENSION citus"
    done
    psql_on coordinator "$db" "SELECT citus_set_coordinator_host('127.0.0.1', ${PORT[coordinator]})" >/dev/null
    for name in worker1 worker2; do
        psql_on coordinator "$db" "SELECT citus_add_node('127.0.0.1', ${PORT[$name]})" >/dev/null
    done
}

cargo build --release --example concurrent_appends >&2
RUN=target/release/examples/concurrent_appends

# CPU time the whole machine has spent busy, in clock ticks (/proc/stat).
busy_ticks() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}

# One run: prints "SECONDS RETRIES AT_ONCE TRANSACTIONS BUSY_CPU_SECONDS" (the machine's busy
# CPU time over the whole run, setup included: what the engines cost beside each other).
run() { # URL ARGS...
    local url="$1"
    shift
    local out before after
    before="$(busy_ticks)"
    out="$("$RUN" --db "$url" "$@")"
    after="$(busy_ticks)"
    echo "$out" >>"$WORK/runs.log"
    local seconds retries at_once transactions
    seconds="$(sed -n 's/.*: \([0-9.]*\) s,.*/\1/p' <<<"$out")"
    retries="$(sed -n 's/.* \([0-9]*\) conflict retries/\1/p' <<<"$out" | paste -sd+ | bc)"
    at_once="$(sed -n 's/.*(\([0-9]*\) written at once).*/\1/p' <<<"$out" | paste -sd+ | bc)"
    transactions="$(sed -n 's/.*batches, \([0-9]*\) transactions.*/\1/p' <<<"$out" | paste -sd+ | bc)"
    echo "$seconds $retries $at_once $transactions $(echo "scale=2; ($after - $before) / $(getconf CLK_TCK)" | bc)"
}

CASES=(
    "16 sessions, one replica|--replicas 1 --sessions 16"
    "16 sessions, two replicas|--replicas 2 --sessions 16"
    "16 sessions, two replicas, all through the coordinator|--replicas 2 --sessions 16 --coordinator-only"
    "8 shared sessions (opposite orders), two replicas|--replicas 2 --sessions 8 --shared"
)

psql_on coordinator postgres "CREATE EXTENSION citus"
echo "$(psql_on coordinator postgres "SELECT citus_version()" | cut -d, -f1) on $("$BIN/postgres" --version);" \
    "a coordinator and 2 workers, 32 shards; fsync=$FSYNC; $(nproc) cores"
printf '%-56s %5s %10s %10s %8s %6s %8s %8s %9s\n' case round PostgreSQL Citus ratio 2PC retries at-once cpu-s
declare -A SUM_RATIO
n=0
for round in $(seq 1 "$ROUNDS"); do
    for entry in "${CASES[@]}"; do
        label="${entry%%|*}"
        args="${entry#*|}"
        n=$((n + 1))
        db="ctxd_bench_$n"
        citus_db "$db"
        citus_url="postgres://postgres@127.0.0.1:${PORT[coordinator]}/$db?sslmode=disable"
        # The tables distributed first (DDL commits in two phases), so that the count below is
        # the appends' own.
        "$RUN" --db "$citus_url" --threads 1 --appends 1 --sessions 1 >/dev/null
        before_2pc="$(psql_on coordinator "$db" "SELECT count(DISTINCT gid) FROM pg_dist_transaction")"
        # shellcheck disable=SC2086
        read -r c_s c_retries c_once c_tx c_cpu < <(run "$citus_url" --threads 16 --appends 50 $args)
        twopc="$(($(psql_on coordinator "$db" "SELECT count(DISTINCT gid) FROM pg_dist_transaction") - before_2pc))"
        psql_on plain postgres "CREATE DATABASE $db"
        plain_url="postgres://postgres@127.0.0.1:${PORT[plain]}/$db?sslmode=disable"
        "$RUN" --db "$plain_url" --threads 1 --appends 1 --sessions 1 >/dev/null
        # shellcheck disable=SC2086
        read -r p_s p_retries _ _ p_cpu < <(run "$plain_url" --threads 16 --appends 50 $args)
        ratio="$(echo "scale=3; $c_s / $p_s" | bc)"
        SUM_RATIO["$label"]="${SUM_RATIO["$label"]:-} $ratio"
        printf '%-56s %5s %9.3fs %9.3fs %7.2fx %6s %8s %8s %9s\n' "$label" "$round" "$p_s" "$c_s" "$ratio" "$twopc" "$c_retries/$p_retries" "$c_once/$c_tx" "$p_cpu/$c_cpu"
        echo "$label|$round|$p_s|$c_s" >>"$WORK/pairs"
    done
done

# Two Citus replicas against one, each round's pair.
echo
echo "ratios (goal: two replicas within 2x of PostgreSQL and within 1.3x of one Citus replica):"
for entry in "${CASES[@]}"; do
    label="${entry%%|*}"
    echo "  $label: Citus / PostgreSQL =${SUM_RATIO["$label"]:-}"
done
for round in $(seq 1 "$ROUNDS"); do
    one="$(grep "^16 sessions, one replica|$round|" "$WORK/pairs" | cut -d'|' -f4)"
    two="$(grep "^16 sessions, two replicas|$round|" "$WORK/pairs" | cut -d'|' -f4)"
    echo "  round $round: two Citus replicas / one = $(echo "scale=3; $two / $one" | bc)"
done
