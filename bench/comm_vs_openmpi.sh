#!/usr/bin/env bash
# All-reduce under mpirun: meshtrain's (`bench comm --backend mpi`, algorithm `auto`, or ALGO)
# against OpenMPI's own MPI_Allreduce (bench/mpi_allreduce_peer.c, built here with mpicc) and
# its MPI_Iallreduce (bench comm's `native` column), float32 sum in place, 4 KiB to 64 KiB,
# all measured the same way in one run of this script: each iteration's time on the slowest
# rank, the median over ITERS x REPS back-to-back iterations.
#
# Usage: bench/comm_vs_openmpi.sh [BUILD_DIR] [NP]
#   env: SIZES (bytes, default "4096 8192 16384 32768 65536"), ITERS (5000), REPS (5),
#        WARMUP (500), ALGO (auto), ROUNDS (2: the two programs alternate, each round prints)
# Prints one table per round: size, meshtrain's time and algorithm, MPI_Allreduce's time and
# the ratio meshtrain / MPI_Allreduce (target: at most 1.2), MPI_Iallreduce's time and ratio.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
np=${2:-2}
sizes=${SIZES:-4096 8192 16384 32768 65536}
iters=${ITERS:-5000}
reps=${REPS:-5}
warmup=${WARMUP:-500}
algo=${ALGO:-auto}
rounds=${ROUNDS:-2}
bin=$build/meshtrain
[ -x "$bin" ] || { echo "no meshtrain at $bin (give the build directory)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpicc -O2 -o "$tmp/peer" "$here/mpi_allreduce_peer.c"
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl vader,self --bind-to none -np "$np")
list=$(echo $sizes | tr ' ' ',')

echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'); CPU:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores;" \
     "load average $(cut -d' ' -f1-3 /proc/loadavg); $(mpirun --version 2>&1 | head -1)"
echo "# np=$np iters=$iters reps=$reps warmup=$warmup algo=$algo; time: per iteration the slowest rank's, median"
for round in $(seq 1 "$rounds"); do
  "${mpi[@]}" "$bin" bench comm --backend mpi --op all_reduce --algo "$algo" --sizes "$list" --iters "$iters" \
    --warmup "$warmup" --reps "$reps" > "$tmp/meshtrain.txt"
  # shellcheck disable=SC2086
  "${mpi[@]}" "$tmp/peer" "$iters" "$reps" "$warmup" $sizes > "$tmp/peer.txt"
  python3 - "$tmp/meshtrain.txt" "$tmp/peer.txt" "$round" "$np" <<'PY'
import sys
mt, peer, rnd, p = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
units = {"K": 1024, "M": 1 << 20, "G": 1 << 30}
def size_of(s):
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)
bus = 2 * (p - 1) / p  # bench comm prints the native figure as bus bandwidth: busbw = algbw x 2(p-1)/p
rows = {}
for line in open(mt):
    f = line.split()
    if not f or line.startswith("#") or f[0] == "size":
        continue
    # size count algo time(us) algbw busbw check native(GB/s) ratio
    size, native = size_of(f[0]), float(f[7])
    rows[size] = (float(f[3]), f[2], f[6], size / (native / bus) / 1e3 if native > 0 else float("nan"))
blocking = {int(a): float(b) for a, b in (l.split() for l in open(peer) if l.strip())}
print(f"# round {rnd}")
print(f"{'size':>8} {'meshtrain(us)':>14} {'algo':>9} {'check':>6} {'MPI_Allreduce(us)':>18} {'ratio':>6} "
      f"{'MPI_Iallreduce(us)':>19} {'ratio':>6}")
worst = 0.0
for size in sorted(rows):
    t, algo, check, nb = rows[size]
    b = blocking.get(size, float("nan"))
    worst = max(worst, t / b)
    print(f"{size:>8} {t:>14.2f} {algo:>9} {check:>6} {b:>18.2f} {t / b:>6.2f} {nb:>19.2f} {t / nb:>6.2f}")
print(f"# worst ratio meshtrain / MPI_Allreduce: {worst:.2f} (target: at most 1.20)")
PY
done
