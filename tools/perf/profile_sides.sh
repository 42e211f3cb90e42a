#!/usr/bin/env bash
# Per-side costs of one measurement (LAYER=na by default; rpc, bulk), for the transport and core
# owners: runs the server and the client
# as separate processes (pinned to CPUs 1 and 0), each under `perf stat`, with the baseline
# skipped, and prints CPU time, context switches and system calls per operation on each side.
# With PROFILE=1 it also records a call-graph profile of each side (perf record, dwarf).
# SERVE_OPTS adds server options (e.g. SERVE_OPTS="--realtime 50" with --realtime 50 for the
# client, on a shared host).
#   profile_sides.sh TALARIA_PERF TRANSPORT PATTERN MODE SIZE ITERS [extra client options]
#   e.g. profile_sides.sh build/release/tools/perf/talaria-perf sm pingpong busy 8 200000
#        LAYER=rpc profile_sides.sh build/release/tools/perf/talaria-perf sm pingpong busy 0 200000
set -euo pipefail
bin=$1 t=$2 pat=$3 mode=$4 size=$5 iters=$6
layer=${LAYER:-na}
server_layer=$layer
[ "$layer" = bulk ] && server_layer=rpc  # one rpc server serves both
shift 6
out=$(mktemp -d /tmp/talaria-perf-sides.XXXXXX)
events=task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter
rec() {
    if [ "${PROFILE:-0}" = 1 ]; then
        echo perf record -q --call-graph dwarf,16384 -o "$out/$1.data" --
    fi
}

perf stat -x, -e "$events" -o "$out/server.stat" -- $(rec server) \
    "$bin" serve "$server_layer" --transport "$t" --cpu 1 --once ${SERVE_OPTS:-} >"$out/ready" &
spid=$!
trap 'kill $spid 2>/dev/null || true' EXIT
for _ in $(seq 200); do [ -s "$out/ready" ] && break; sleep 0.05; done
line=$(head -1 "$out/ready")
addr=$(sed -n 's/.* address=\([^ ]*\).*/\1/p' <<<"$line")
ctl=$(sed -n 's/.* ctl=\([^ ]*\).*/\1/p' <<<"$line")
[ -n "$addr" ] && [ -n "$ctl" ] || { echo "server did not start: $line" >&2; exit 1; }

perf stat -x, -e "$events" -o "$out/client.stat" -- $(rec client) \
    "$bin" "$layer" -t "$t" --connect "$addr" --ctl "$ctl" --client-cpu 0 -p "$pat" -m "$mode" \
    -s "$size" --iters "$iters" --reps 1 --no-baseline "$@" | grep -E "^(layer|$layer) "
wait $spid || true
trap - EXIT

# Operations counted: the warm-up (min(iters, 1000)) plus one repetition.
ops=$((iters + (iters < 1000 ? iters : 1000)))
for side in client server; do
    awk -F, -v side=$side -v ops=$ops '
        $3 == "task-clock" { cpu = $1 }
        $3 == "context-switches" { cs = $1 }
        $3 == "raw_syscalls:sys_enter" { sc = $1 }
        END { printf "%-6s per op: %.3f us CPU, %.3f context switches, %.3f system calls\n",
              side, cpu * 1000 / ops, cs / ops, sc / ops }' "$out/$side.stat"
done
if [ "${PROFILE:-0}" = 1 ]; then
    for side in client server; do
        echo "--- $side: top symbols (perf report --no-children; callers: perf report -i" \
             "$out/$side.data --no-children -G)"
        perf report -q -i "$out/$side.data" --no-children --sort symbol -g none 2>/dev/null \
            | grep -v '^$' | sed 's/ *-  *- *$//' | head -15 || true
    done
fi
echo "(raw data in $out)"
