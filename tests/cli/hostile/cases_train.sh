# `meshtrain train`: outputs never overwrite inputs, every flag acts or is refused.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder with corpus.txt).
T=(train --data corpus.txt --steps 2 --quiet)

# ---- outputs that would destroy an input or another output ----
expect 2 "--metrics corpus.txt is the same file as --data corpus.txt" -- "$MT" "${T[@]}" --metrics corpus.txt
expect 2 "--trace corpus.txt is the same file as --data" -- "$MT" "${T[@]}" --trace corpus.txt
expect 2 "--trace m.jsonl is the same file as --metrics m.jsonl" -- "$MT" "${T[@]}" --metrics m.jsonl --trace m.jsonl
expect 2 "swimlane t.svg is the same file as --metrics t.svg" -- "$MT" "${T[@]}" --metrics t.svg --trace t.json
ln -sf corpus.txt "$WORK/link.txt"
expect 2 "--metrics link.txt is the same file as --data corpus.txt" -- "$MT" "${T[@]}" --metrics link.txt
ln -f "$WORK/corpus.txt" "$WORK/hard.txt"
expect 2 "--metrics hard.txt is the same file as --data corpus.txt" -- "$MT" "${T[@]}" --metrics hard.txt
echo "my notes" > "$WORK/notes.txt"
expect 2 "notes.txt already exists and was not written by meshtrain" -- "$MT" "${T[@]}" --metrics notes.txt
expect 0 "" --may-write notes.txt -- "$MT" "${T[@]}" --metrics notes.txt --overwrite
rm -f "$WORK/link.txt" "$WORK/hard.txt" "$WORK/notes.txt"

# ---- a checkpoint directory means saving ----
expect 0 "" --may-write ck_alone -- "$MT" "${T[@]}" --checkpoint-dir ck_alone
expect 0 "^step_00000002$" -- cat ck_alone/latest
mkdir -p "$WORK/ck_user" && echo mine > "$WORK/ck_user/latest"
expect 2 "holds a file .latest. but no step folder" -- "$MT" "${T[@]}" --checkpoint-dir ck_user
ln -sfn /nonexistent/target "$WORK/dangling"
expect 2 "dangling is a symbolic link to /nonexistent/target, which does not exist" -- "$MT" "${T[@]}" --checkpoint-dir dangling/ck
long=$(printf 'n%.0s' $(seq 300))
expect 2 "more than the 255 a file name may have" -- "$MT" "${T[@]}" --checkpoint-dir "$long"
expect 2 "more than the 255 a file name may have" -- "$MT" "${T[@]}" --metrics "$long"
deep=$(printf 'd%.0s' $(seq 200)); deep=$(printf "$deep/%.0s" $(seq 25))
expect 2 "more than the 4095 a path may have" -- "$MT" "${T[@]}" --checkpoint-dir "$deep"
expect 2 "--metrics ck_alone/latest lies among the files --checkpoint-dir ck_alone manages" -- \
  "$MT" train --data corpus.txt --quiet --checkpoint-dir ck_alone --resume --steps 3 --metrics ck_alone/latest
rm -f "$WORK/dangling"

# ---- every flag acts or is refused ----
expect 2 "--schedule chooses the pipeline schedule; it needs --pp 2" -- "$MT" "${T[@]}" --schedule gpipe
expect 2 "--recompute .* needs --pp 2" -- "$MT" "${T[@]}" --recompute
expect 2 "--pad-vocab .* needs --tp 2" -- "$MT" "${T[@]}" --pad-vocab
expect 2 "--bucket-mb .* needs --dp 2" -- "$MT" "${T[@]}" --bucket-mb 2
expect 2 "parameter server does not record a trace" -- "$MT" "${T[@]}" --dp 2 --ps-servers 1 --trace t.json
expect 2 "--staleness .* needs --ps-servers" -- "$MT" "${T[@]}" --staleness 3
expect 2 "--keep-checkpoints needs --checkpoint-dir" -- "$MT" "${T[@]}" --keep-checkpoints 2
expect 2 "--zero 2 shards .* needs --dp 2" -- "$MT" "${T[@]}" --zero 2
expect 2 "--log-every .* --quiet" -- "$MT" "${T[@]}" --log-every 5
printf '{"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "block_size": 64}' > "$WORK/model.json"
expect 2 "--model and --config both choose the model" -- "$MT" "${T[@]}" --config model.json --model gpt-small
printf '{"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "block_size": 64, "n_layer": 3}' > "$WORK/dup.json"
expect 2 "gives the field \"n_layer\" more than once" -- "$MT" "${T[@]}" --config dup.json
expect 2 "--min-lr 1 is above --lr 0.1" -- "$MT" "${T[@]}" --lr 0.1 --min-lr 1
expect 2 "MESHTRAIN_COMM_TIMEOUT_S='soon' is not a number of seconds" -- env MESHTRAIN_COMM_TIMEOUT_S=soon "$MT" "${T[@]}"
expect 2 "MESHTRAIN_COMM_TIMEOUT_S='nan' is not a number of seconds" -- env MESHTRAIN_COMM_TIMEOUT_S=nan "$MT" "${T[@]}"
expect 2 "--metrics is empty" -- "$MT" "${T[@]}" --metrics ""
expect 2 "--pp-balance is empty" -- "$MT" "${T[@]}" --pp 2 --pp-balance ""
expect 2 "--pp-balance '2,2,' has an empty item" -- "$MT" "${T[@]}" --pp 2 --pp-balance 2,2,
expect 2 "validation batches .* fewer --eval-batches" -- "$MT" "${T[@]}" --eval-batches 100000000
rm -f "$WORK/model.json" "$WORK/dup.json"

# ---- inputs that are not files ----
mkfifo "$WORK/fifo"
expect 2 "fifo: is not a regular file" -- "$MT" train --data fifo --steps 2 --quiet
rm -f "$WORK/fifo"
expect 2 "/dev/zero: is not a regular file" -- "$MT" train --data /dev/zero --steps 2 --quiet

# ---- resuming on another data file says so ----
head -c 150000 "$WORK/corpus.txt" > "$WORK/other.txt"
expect 0 "note: --data other.txt is not the file ck_alone/step_00000002 was trained on" --may-write ck_alone -- \
  "$MT" train --data other.txt --steps 3 --quiet --checkpoint-dir ck_alone --resume
rm -rf "$WORK/other.txt" "$WORK/ck_alone"
rm -rf "$WORK/ck_user"
# A timed checkpoint cadence needs somewhere to save, and a number of seconds.
expect 2 "--checkpoint-every-s needs --checkpoint-dir DIR" -- \
  "$MT" train --data corpus.txt --steps 1 --checkpoint-every-s 60 --quiet
expect 2 "--checkpoint-every-s must be a finite number of seconds above 0" -- \
  "$MT" train --data corpus.txt --steps 1 --checkpoint-every-s inf --checkpoint-dir timed_ck --quiet
