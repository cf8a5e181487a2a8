#!/usr/bin/env python3
"""PostgreSQL's floor for `cargo bench --bench store`: raw durable INSERTs through psycopg.

One ~500-byte row per transaction (autocommit, so each INSERT commits and waits for its WAL
flush under the server's synchronous_commit), into a table of its own in the database the
bench created. The bench runs this script and compares ctxd's PostgreSQL appends to it.

    pg_floor.py URL --tag T --writers 1 64

For 1 writer: untimed warm-up, then per-row latency samples (the same plan as the bench's
SQLite floor) and rows/s from the first timed row's start. For N > 1 writers: N threads, each
with its own connection, inserting back to back; rows/s over a window after a warm-up, and the
latency of the rows completed in it. Prints one JSON object on stdout.
"""

import argparse
import json
import sys
import threading
import time

try:
    import psycopg
except ImportError as e:
    # The bench checks the import before running the script; this is for running it by hand.
    sys.exit(f"psycopg cannot be imported ({e}): pip install 'psycopg[binary]'")

ROW_BYTES = 500
TABLE = """CREATE TABLE IF NOT EXISTS bench_floor (
    id bigserial PRIMARY KEY, session bytea NOT NULL, body text NOT NULL)"""
INSERT = "INSERT INTO bench_floor (session, body) VALUES (%s, %s)"
SESSION = bytes([7] * 16)
FILLER = "the quick brown fox jumps over the lazy dog; " * (ROW_BYTES // 40 + 1)


def body(tag, i):
    """A unique ~ROW_BYTES text, so no two rows are equal."""
    prefix = f"[{tag} {i}] "
    return prefix + FILLER[: ROW_BYTES - len(prefix)]


def percentile(sorted_times, p):
    """Nearest rank, as the bench computes it."""
    rank = max(1, -(-p * len(sorted_times) // 100))
    return sorted_times[rank - 1]


def stats(times):
    times = sorted(times)
    return {
        "samples": len(times),
        "p50_us": percentile(times, 50) * 1e6,
        "p95_us": percentile(times, 95) * 1e6,
    }


def one_writer(url, tag, a):
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        warmed, timed_since, first_timed, times, i = 0, None, None, [], 0
        while True:
            if timed_since is not None:
                elapsed = time.perf_counter() - timed_since
                if len(times) >= a.min and (elapsed >= a.time_ms / 1e3 or len(times) >= a.max):
                    break
            start = time.perf_counter()
            conn.execute(INSERT, (SESSION, body(tag, i)))
            took = time.perf_counter() - start
            i += 1
            if timed_since is None:
                if warmed < a.warmup_iters or start - started < a.warmup_ms / 1e3:
                    warmed += 1
                    continue
                timed_since = time.perf_counter()
                first_timed = start
            times.append(took)
        rate = len(times) / (time.perf_counter() - first_timed)
    return {"writers": 1, "rows_per_s": rate, **stats(times)}


def many_writers(url, tag, writers, a):
    conns = [psycopg.connect(url, autocommit=True) for _ in range(writers)]
    done = [0] * writers
    times = [[] for _ in range(writers)]
    counting = threading.Event()
    stop = threading.Event()

    def run(w):
        conn, i = conns[w], 0
        while not stop.is_set():
            start = time.perf_counter()
            conn.execute(INSERT, (SESSION, body(f"{tag}.{w}", i)))
            took = time.perf_counter() - start
            i += 1
            if counting.is_set():
                times[w].append(took)
            done[w] += 1

    threads = [threading.Thread(target=run, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    time.sleep(a.rate_warmup_ms / 1e3)
    before, start = sum(done), time.perf_counter()
    counting.set()
    time.sleep(a.rate_ms / 1e3)
    after, took = sum(done), time.perf_counter() - start
    counting.clear()
    stop.set()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    return {
        "writers": writers,
        "rows_per_s": (after - before) / took,
        **stats([t for ts in times for t in ts]),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="a postgres:// URL of the database to write to")
    p.add_argument("--tag", default="f", help="makes this run's rows unique")
    p.add_argument("--writers", type=int, nargs="+", default=[1])
    p.add_argument("--warmup-iters", type=int, default=20)
    p.add_argument("--warmup-ms", type=float, default=200)
    p.add_argument("--min", type=int, default=200)
    p.add_argument("--time-ms", type=float, default=1_500)
    p.add_argument("--max", type=int, default=5_000)
    p.add_argument("--rate-warmup-ms", type=float, default=300)
    p.add_argument("--rate-ms", type=float, default=2_000)
    a = p.parse_args()

    with psycopg.connect(a.url, autocommit=True) as conn:
        conn.execute(TABLE)
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]
            for name in ("synchronous_commit", "fsync", "wal_sync_method")
        }
    results = [
        one_writer(a.url, a.tag, a) if n == 1 else many_writers(a.url, a.tag, n, a)
        for n in a.writers
    ]
    print(
        json.dumps(
            {
                "psycopg": psycopg.__version__,
                "python": sys.version.split()[0],
                "settings": settings,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
