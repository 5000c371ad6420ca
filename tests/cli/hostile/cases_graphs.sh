# Model files (layer graphs, docs/models.md): every malformed graph exits 2 with a sentence
# naming the layer and the field, and writes nothing; `model show` refuses what train refuses.
# Sourced by tests/cli/hostile.sh ($MT: the program, $WORK: the scratch folder).
graph() {  # graph FILE LAYERS-JSON [INPUT-JSON]: a model file with these layers
  printf '{"name": "g", "input": %s, "layers": [%s]}\n' "${3:-{\"image\": [1, 28, 28], \"classes\": 10\}}" "$2" >"$WORK/$1"
}
FC='{"name": "fc", "op": "linear", "out_features": 10}'
graph g_noop.json '{"name": "a"}'
expect 2 "layer 0 'a' has no \"op\"" -- "$MT" train --model g_noop.json --data fashion-mnist --steps 1 --quiet
graph g_op.json '{"name": "a", "op": "conv3d"}'
expect 2 "layer 0 'a' has the unknown op 'conv3d'; the ops are conv2d, batchnorm2d" -- "$MT" model show g_op.json
graph g_field.json '{"name": "a", "op": "conv2d", "out_channels": 8, "kernel": 3}'
expect 2 "layer 0 'a' \\(conv2d\\) has the unknown field \"kernel\"; conv2d takes out_channels, kernel_size" -- \
  "$MT" train --model g_field.json --data fashion-mnist --steps 1 --quiet
graph g_from.json '{"name": "f", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 10, "from": "nope"}'
expect 2 "layer 1 'fc' reads 'nope', which names no layer" -- "$MT" model show g_from.json
graph g_cycle.json '{"name": "a", "op": "relu", "from": "b"}, {"name": "b", "op": "flatten"}, '"$FC"
expect 2 "layer 0 'a' reads 'b', a later layer" -- "$MT" train --model g_cycle.json --data fashion-mnist --steps 1 --quiet
graph g_add.json '{"name": "a", "op": "conv2d", "out_channels": 32, "kernel_size": 1},
  {"name": "b", "op": "conv2d", "out_channels": 64, "kernel_size": 1, "from": "input"},
  {"name": "s", "op": "add", "from": ["a", "b"]}, {"name": "f", "op": "flatten"}, '"$FC"
expect 2 "layer 2 's' \\(add\\) adds 'a' \\(N, 32, 28, 28\\) and 'b' \\(N, 64, 28, 28\\)" -- "$MT" model show g_add.json
graph g_flat.json '{"name": "a", "op": "conv2d", "out_channels": 8, "kernel_size": 3}, '"$FC"
expect 2 "layer 1 'fc' \\(linear\\) takes features \\(N, F\\); its input 'a' is \\(N, 8, 26, 26\\): put a flatten" -- \
  "$MT" train --model g_flat.json --data fashion-mnist --steps 1 --quiet
graph g_shrink.json '{"name": "a", "op": "conv2d", "out_channels": 8, "kernel_size": 7}, {"name": "f", "op": "flatten"}, '"$FC" \
  '{"image": [1, 4, 4], "classes": 10}'
expect 2 "layer 0 'a' \\(conv2d\\) has a 7x7 convolution over a 4x4 map \\(padding 0\\): the map would shrink below 1" -- \
  "$MT" model show g_shrink.json
graph g_dup.json '{"name": "a", "op": "flatten"}, {"name": "a", "op": "linear", "out_features": 10}'
expect 2 "layer 1 'a' has the name of layer 0; names must be unique" -- "$MT" model show g_dup.json
graph g_range.json '{"name": "f", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 99999999999}'
expect 2 "layer 1 'fc' \\(linear\\): \"out_features\" is 99999999999, more than 16777216" -- "$MT" model show g_range.json
printf '[1, 2]\n' >"$WORK/g_array.json"
expect 2 "model config file g_array.json is array, but a model file must be a JSON object: a layer graph" -- "$MT" model show g_array.json
expect 2 "model config file missing.json does not exist" -- "$MT" model show missing.json
expect 2 "unknown model 'vgg-huge'" -- "$MT" model show vgg-huge
# Token models: the named transformers are graphs; a GPT config is not; a token graph that is no
# pre-norm GPT is refused naming the layer.
expect 0 "h.3.mlp.c_proj +linear" -- "$MT" model show gpt-tiny
printf '{"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "block_size": 32}\n' >"$WORK/g_gptcfg.json"
expect 2 "g_gptcfg.json is a GPT config \\(n_layer, n_embd, ...\\), not a layer graph" -- "$MT" model show g_gptcfg.json
TOK='{"tokens": 16, "vocab": 256}'
graph g_tokconv.json '{"name": "wte", "op": "embedding", "num_embeddings": 256, "embedding_dim": 32},
  {"name": "c", "op": "conv2d", "out_channels": 8, "kernel_size": 3}' "$TOK"
expect 2 "layer 1 'c' has the op 'conv2d', which image models take; a model of tokens takes linear, add, embedding" -- \
  "$MT" train --model g_tokconv.json --data fashion-mnist --steps 1 --quiet
graph g_noblock.json '{"name": "wte", "op": "embedding", "num_embeddings": 256, "embedding_dim": 32},
  {"name": "wpe", "op": "position_embedding", "num_embeddings": 16, "embedding_dim": 32, "from": "input"},
  {"name": "e", "op": "add", "from": ["wte", "wpe"]}, {"name": "ln_f", "op": "layernorm"},
  {"name": "head", "op": "linear", "out_features": 256}' "$TOK"
expect 2 "layer 3 'ln_f' \\(layernorm\\) comes before any block; give at least one block h.0" -- \
  "$MT" model show g_noblock.json
# Dropout: p of 1 drops everything; on a feature map it cannot be split into row bands.
graph g_p1.json '{"name": "f", "op": "flatten"}, {"name": "d", "op": "dropout", "p": 1}, '"$FC"
expect 2 "layer 1 'd' \\(dropout\\): \"p\" is 1, which drops everything" -- "$MT" model show g_p1.json
graph g_dmap.json '{"name": "c", "op": "conv2d", "out_channels": 8, "kernel_size": 3, "padding": 1},
  {"name": "d", "op": "dropout", "p": 0.2}, {"name": "f", "op": "flatten"}, '"$FC"
expect 2 "--spatial 2 cannot split g's layer 1 'd' \\(dropout\\) over bands of rows" -- \
  "$MT" train --model g_dmap.json --data fashion-mnist --steps 1 --quiet --spatial 2
# 100,000 layers: refused before any layer is built.
python3 -c 'import json; print(json.dumps({"name": "big", "input": {"image": [1, 28, 28], "classes": 10},
  "layers": [{"name": "r%d" % i, "op": "relu"} for i in range(100000)]}))' >"$WORK/g_big.json"
expect 2 "\"layers\" has 100000 layers, more than the 10000 a graph may have" -- "$MT" model show g_big.json
# (vgg-mini's two convolutions run whole under --tp, model::filter_split_pays: resnet-cut's pairs
# are what tp 3 cannot divide.)
expect 2 "--tp 3 cannot split resnet-cut's convolutions: b1.conv1 \\(16 output channels\\) do not divide by 3" -- \
  "$MT" model show "$SOURCE_DIR/examples/models/resnet-cut.json" --tp 3
expect 2 "--tp, --spatial and --branch-parallel each split the layers" -- \
  "$MT" model show "$SOURCE_DIR/examples/models/vgg-mini.json" --tp 2 --spatial 2
rm -f "$WORK"/g_*.json
