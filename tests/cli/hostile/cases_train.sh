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
