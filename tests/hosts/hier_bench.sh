#!/usr/bin/env bash
# Hierarchical against flat-ring all-reduce on two "hosts" (tests/hosts/netns.sh) of two MPI ranks
# each, the links between the hosts limited by `tc` (RATE, default 1gbit, both directions of host
# b's veth pair): bus bandwidth of both at SIZE (default 64M) and the bytes each sent across hosts
# (counted by the communicator), with their ratio from the same run. docs/benchmarks.md quotes it.
# Usage: hier_bench.sh MESHTRAIN MPIRUN [SIZE] [RATE]   (exit 77: skipped, with the reason)
set -euo pipefail
bin=$(readlink -f "$1") mpirun=$2 size=${3:-64M} rate=${4:-1gbit}
source "$(dirname "$0")/netns.sh"
hosts_up "$mpirun"
# Two ranks on each host; TCP throughout, as the other host tests (inside a host over its own
# address, which the shaping below does not touch).
two_ranks_a_host
# The link: host b's end and its peer on host a's bridge, each direction shaped to RATE. The
# kernel here may lack netem (no added latency then; said below).
shape() {
  local ns=$1 dev=$2
  tc -n "$ns" qdisc add dev "$dev" root handle 1: tbf rate "$rate" burst 256kb latency 100ms
  tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: netem delay 1ms 2>&1 || true
}
shape "$ns_b" "$veth_b" | tee "$dir/netem.txt"
shape "$ns_a" "p$ns_b"
latency=1ms
if [ -s "$dir/netem.txt" ]; then latency="none added (netem: $(head -1 "$dir/netem.txt"))"; fi
echo "# links between hosts: tbf rate $rate both ways; latency: $latency"
tc -n "$ns_b" qdisc show dev "$veth_b"
grep -m1 "model name" /proc/cpuinfo
nproc
run() {  # run SIZE FLAGS...
  local sz=$1
  shift
  timeout 600 "${four[@]}" "$bin" bench comm --backend mpi --op all_reduce --sizes "$sz" --iters 3 --warmup 1 \
    --reps 2 --timeout 300 "$@"
}
# The hosts as the MPI library sees them (MPI_COMM_TYPE_SHARED); --ranks-per-host 2 states them
# where it sees one node.
hosts=()
run 4K --algo ring | tee "$dir/probe.txt"
grep -q "^# hosts: 2 of 2 ranks" "$dir/probe.txt" || {
  echo "# the MPI library sees one node: hosts given by --ranks-per-host 2"
  hosts=(--ranks-per-host 2)
}
run "$size" --algo ring "${hosts[@]}" | tee "$dir/ring.txt"
run "$size" --algo hier "${hosts[@]}" | tee "$dir/hier.txt"
python3 - "$dir/ring.txt" "$dir/hier.txt" <<'PY'
import sys
def row(path):
    for line in open(path):
        f = line.split()
        if f and not line.startswith("#") and f[0] != "size":
            return f
ring, hier = row(sys.argv[1]), row(sys.argv[2])
# columns: size count algo time algbw busbw check native ratio xhost(max) xhost(mean)
print(f"ring: busbw {ring[5]} GB/s, {ring[3]} us, cross-host bytes max {ring[9]} mean {ring[10]}")
print(f"hier: busbw {hier[5]} GB/s, {hier[3]} us, cross-host bytes max {hier[9]} mean {hier[10]}")
# The ratio of the two bus bandwidths from the times (the printed bandwidths have three decimals,
# too few for the second digit of their ratio at 0.1 GB/s).
print(f"hier / ring bus bandwidth: {float(ring[3]) / float(hier[3]):.3f}")
ok = ring[6] == "ok" and hier[6] == "ok"
print("HIER BENCH OK" if ok else "HIER BENCH WRONG RESULTS")
PY
