"""Train a small CNN from Python at dp 2 x pp 2 and plot its loss (docs/python.md).

A notebook's cells, one after another: run it whole (`python3 examples/python/train_and_plot.py`
with the package installed, or PYTHONPATH=build/python), or paste the cells into Jupyter.
matplotlib is optional: with it the loss curve is written to loss.png (or the path given as the
first argument), without it the rows are printed.
"""

# %% The model: a graph built in code (the same JSON a model file holds, docs/models.md).
import sys

import meshtrain

net = (meshtrain.Builder("tiny-cnn", image=(1, 28, 28), classes=10, batch=32)
       .conv2d("features.0", out_channels=8, kernel_size=3, padding=1)
       .batchnorm2d("features.1")
       .relu("features.2")
       .maxpool2d("features.3", kernel_size=2)
       .flatten("flat")
       .linear("classifier", out_features=10)
       .build())
print(net.show())  # the layer table of `meshtrain model show`

# %% Train: every option of `meshtrain train`, dashes as underscores. Ranks are C++ threads; the
# GIL is released while they train and taken back for on_step on rank 0.
def progress(row):
    if row["step"] % 10 == 0:
        print(f"step {row['step']:3d}  loss {row['loss']:.4f}")

run = meshtrain.train(net, data="fashion-mnist", steps=60, dp=2, pp=2, microbatches=2,
                      optimizer="sgd", lr=0.05, momentum=0.9, on_step=progress, quiet=True)
print(run, "test accuracy:", run.final_val_accuracy)

# %% The weights, under PyTorch's names (torch.nn.Module.load_state_dict takes them).
weights = run.state_dict()
for name, array in weights.items():
    print(f"{name:32s} {tuple(array.shape)}")

# %% The loss curve from the rows.
steps = [row["step"] for row in run.metrics]
losses = [row["loss"] for row in run.metrics]
try:
    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt
except ImportError:
    print("matplotlib is not installed; the rows instead:")
    for s, loss in zip(steps, losses):
        print(s, loss)
else:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, losses, label="training loss (dp 2 x pp 2)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title("tiny-cnn on Fashion-MNIST")
    ax.legend()
    out = sys.argv[1] if len(sys.argv) > 1 else "loss.png"
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)
