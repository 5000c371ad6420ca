# Hosts and the hierarchical all-reduce (train --allreduce/--ranks-per-host, bench comm --algo
# hier/--ranks-per-host): every value that cannot work is refused saying what to change.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with corpus.txt).
T=(train --data corpus.txt --steps 1 --quiet)

# ---- train: hier needs two or more hosts with as many data-parallel ranks on each ----
expect 2 "all 4 ranks are on one host; on threads give --ranks-per-host K" -- "$MT" "${T[@]}" --dp 4 --allreduce hier
expect 2 "with --ranks-per-host 4 the data-parallel ranks .* are all on one host; give a smaller --ranks-per-host" -- \
  "$MT" "${T[@]}" --dp 4 --ranks-per-host 4 --allreduce hier
expect 2 "--ranks-per-host 3 does not divide the 4 ranks of this run" -- "$MT" "${T[@]}" --dp 4 --ranks-per-host 3
expect 2 "--ranks-per-host must be at least 1" -- "$MT" "${T[@]}" --dp 4 --ranks-per-host 0
expect 2 "--ranks-per-host must be at least 1" -- "$MT" "${T[@]}" --dp 4 --ranks-per-host -2
expect 2 "needs as many data-parallel ranks on each host" -- \
  "$MT" "${T[@]}" --dp 3 --tp 2 --ranks-per-host 3 --allreduce hier
expect 2 "--zero 2 reduce-scatters them instead; use --zero 0 or 1" -- \
  "$MT" "${T[@]}" --dp 4 --ranks-per-host 2 --allreduce hier --zero 2
expect 2 "--comm-dtype bf16 exchanges bf16 slices with an all-to-all instead; drop one of them" -- \
  "$MT" "${T[@]}" --dp 4 --ranks-per-host 2 --allreduce hier --comm-dtype bf16
expect 2 "--allreduce must be auto, ring, rhd, tree, hier, shm or native, not 'bogus'" -- "$MT" "${T[@]}" --dp 2 --allreduce bogus
expect 2 "--allreduce is empty" -- "$MT" "${T[@]}" --dp 2 --allreduce ""
expect 2 "--allreduce chooses how the data-parallel gradients are all-reduced; it needs --dp 2 or more" -- \
  "$MT" "${T[@]}" --allreduce ring
expect 2 "--allreduce native calls the MPI library's own all-reduce; it needs --backend mpi" -- \
  "$MT" "${T[@]}" --dp 2 --allreduce native

# ---- bench comm ----
B=(bench comm --iters 1 --warmup 0 --reps 1 --sizes 4K)
expect 2 "--algo hier reduces inside each host and then across hosts, and the 4 ranks are one host; give --ranks-per-host K" -- \
  "$MT" "${B[@]}" --world 4 --algo hier
expect 2 "the 4 ranks are one host" -- "$MT" "${B[@]}" --world 4 --ranks-per-host 4 --algo hier
expect 2 "--ranks-per-host 3 does not divide the 4 ranks" -- "$MT" "${B[@]}" --world 4 --ranks-per-host 3
expect 2 "--ranks-per-host must be at least 1" -- "$MT" "${B[@]}" --world 4 --ranks-per-host 0
expect 2 "--algo hier does not implement all_gather" -- "$MT" "${B[@]}" --world 4 --ranks-per-host 2 --algo hier --op all_gather
expect 0 "# hosts: 2 of 2 ranks" -- "$MT" "${B[@]}" --world 4 --ranks-per-host 2 --algo hier
