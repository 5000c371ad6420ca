#!/usr/bin/env bash
# Two "hosts" on one machine (tests/hosts/netns.sh), one MPI rank in each: trains the given
# layout across them and checks every step's loss against the same layout on threads in one
# process (1e-5 relative).
# Usage: two_hosts.sh MESHTRAIN MPIRUN LAYOUT-FLAGS...   (exit 77: skipped, with the reason)
set -euo pipefail
bin=$(readlink -f "$1") mpirun=$2
shift 2
source "$(dirname "$0")/netns.sh"
hosts_up "$mpirun"
write_corpus "$dir/corpus.txt"
common=(train --data "$dir/corpus.txt" --batch 12 --seq 32 --steps 20 --warmup 5 --eval-every 0 --eval-batches 1
        --threads 1 --quiet "$@")
"$bin" "${common[@]}" --metrics "$dir/threads.jsonl"
timeout 300 "${launch[@]}" "$bin" "${common[@]}" --backend mpi --metrics "$dir/hosts.jsonl"
python3 "$(dirname "$0")/../compare_losses.py" "$dir/threads.jsonl" "$dir/hosts.jsonl" 20 "the two-host run" "TWO HOSTS OK"
