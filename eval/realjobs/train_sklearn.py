"""A real scikit-learn training job for Governor's real-job benchmark: an ``MLPClassifier`` on
sklearn's bundled digits (or ``SGDRegressor``-free MLP regression on a synthetic teacher) trained
epoch by epoch with ``partial_fit``, logging one line per epoch in the generic ``print_kv`` style
(``epoch 3/40, loss 0.251, val_loss 0.274``). Its matrix products run in OpenBLAS, whose threads
(``OPENBLAS_NUM_THREADS``) can outnumber the cores: the "more threads than cores" job.

Same options as train_keras.py where they apply: --epochs, --log, --summary, --seed,
--quiet-start, --pause EPOCH:S; SIGINT ends training after the current epoch.
"""
import argparse
import json
import resource
import signal
import time

STARTED = time.time()
parser = argparse.ArgumentParser()
parser.add_argument("--task", default="digits")
parser.add_argument("--epochs", type=int, default=40)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--samples", type=int, default=8000)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--log", required=True)
parser.add_argument("--summary", default="")
parser.add_argument("--times", default="", help="side file: 'epoch unix_time loss val_loss' per epoch")
parser.add_argument("--quiet-start", type=float, default=0.0)
parser.add_argument("--pause", default="")
args = parser.parse_args()

if args.quiet_start > 0:
    time.sleep(args.quiet_start)

import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.metrics import log_loss, mean_squared_error  # noqa: E402
from sklearn.neural_network import MLPClassifier, MLPRegressor  # noqa: E402

rng = np.random.default_rng(args.seed)
if args.task == "digits":
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    reps = max(1, args.samples // len(x))
    x = np.concatenate([x + rng.normal(0, 0.15, x.shape) for _ in range(reps)])
    y = np.concatenate([y] * reps)
    model = MLPClassifier(hidden_layer_sizes=(args.width, args.width), learning_rate_init=args.lr, random_state=args.seed)
    classes = np.arange(10)
else:
    d = 32
    x = rng.normal(size=(args.samples, d))
    w1 = rng.normal(size=(d, 64)) / np.sqrt(d)
    y = np.tanh(x @ w1) @ (rng.normal(size=64) / 8.0) + rng.normal(0, 0.02, args.samples)
    model = MLPRegressor(hidden_layer_sizes=(args.width, args.width), learning_rate_init=args.lr, random_state=args.seed)
    classes = None
perm = rng.permutation(len(x))
x, y = x[perm], y[perm]
split = int(0.8 * len(x))
xt, yt, xv, yv = x[:split], y[:split], x[split:], y[split:]

stop = {"asked": False}
signal.signal(signal.SIGINT, lambda s, f: stop.update(asked=True))
done = 0
times = open(args.times, "a", buffering=1) if args.times else None
with open(args.log, "a", buffering=1) as log:
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(xt))
        for start in range(0, len(xt), 256):
            idx = order[start:start + 256]
            if classes is not None:
                model.partial_fit(xt[idx], yt[idx], classes=classes)
            else:
                model.partial_fit(xt[idx], yt[idx])
        if classes is not None:
            val = log_loss(yv, model.predict_proba(xv), labels=classes)
        else:
            val = mean_squared_error(yv, model.predict(xv))
        log.write(f"epoch {epoch}/{args.epochs}, loss {model.loss_:.6f}, val_loss {val:.6f}\n")
        if times is not None:
            times.write(f"{epoch} {time.time():.3f} {model.loss_} {val}\n")
        done = epoch
        if args.pause:
            at, secs = args.pause.split(":")
            if epoch == int(at):
                time.sleep(float(secs))
        if stop["asked"]:
            break
if args.summary:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(args.summary, "w") as f:
        json.dump({"cpu_seconds": usage.ru_utime + usage.ru_stime, "epochs_done": done,
                   "stopped_early": stop["asked"], "wall_seconds": time.time() - STARTED}, f)
