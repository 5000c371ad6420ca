# The tool subcommands (bench comm, schedule, trace render, checkpoint convert, generate):
# strict values, outputs that never overwrite an input, checkpoints that disagree with
# themselves refused. Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch
# folder with corpus.txt).

# ---- bench comm --sizes: whole, finite, element-sized byte counts that fit in memory ----
B=(bench comm --iters 1 --warmup 0 --reps 1)
expect 2 "--sizes 4:1.8e19: '1.8e19' is more than 1 TiB" -- "$MT" "${B[@]}" --sizes 4:1.8e19
expect 2 "--sizes 1:1.8e19: '1' is 1 bytes, less than one float32 element" -- "$MT" "${B[@]}" --sizes 1:1.8e19
expect 2 "--sizes 64G: the largest size, 64G, needs at least .* available" -- "$MT" "${B[@]}" --sizes 64G
expect 2 "--sizes nan: 'nan' is not a size" -- "$MT" "${B[@]}" --sizes nan
expect 2 "--sizes inf: 'inf' is not a size" -- "$MT" "${B[@]}" --sizes inf
expect 2 "--sizes 0.1: '0.1' is 0.1 bytes, not a whole number of bytes" -- "$MT" "${B[@]}" --sizes 0.1
expect 2 "--sizes 6: '6' is 6 bytes, not a multiple of the 4-byte float32 element; give 4 or 8" -- "$MT" "${B[@]}" --sizes 6
expect 2 "--sizes 4K,,8K: item 2 is empty" -- "$MT" "${B[@]}" --sizes 4K,,8K
expect 2 "--sizes 8K:4K: the range runs backwards" -- "$MT" "${B[@]}" --sizes 8K:4K
expect 2 "--sizes 4K:8K:16K: give either one range" -- "$MT" "${B[@]}" --sizes 4K:8K:16K
expect 2 "8 is less than one float32 element per rank for all_gather over 3 ranks" -- \
  "$MT" "${B[@]}" --op all_gather --world 3 --sizes 8
expect 0 "rounded down to a multiple of 3 ranks" -- "$MT" "${B[@]}" --op all_gather --world 3 --sizes 1K
