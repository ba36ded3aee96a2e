"""A real Keras (TensorFlow, CPU) training job for Governor's real-job benchmark and demo.

It trains a small network on data that ships with scikit-learn or is generated locally (the
benchmark machines reach only the package registries, so nothing is downloaded), logs every epoch
with Keras's own ``CSVLogger`` (the ``keras_csv`` format Governor parses), and writes a summary
JSON at exit (its CPU time, epochs done, how it ended).

Tasks (``--task``), chosen for different convergence speeds:
  digits      MLP on sklearn's 8x8 digits (1,797 images): learns fast, plateaus early.
  digits_cnn  small CNN on the digits upsampled to 16x16: slower epochs, plateaus mid-run.
  teacher     MLP regressing a fixed random "teacher" network's output on synthetic inputs:
              the loss keeps falling slowly for most of the run.

Quiet phases, as real jobs have them: ``--quiet-start S`` sleeps before the data is prepared
(waiting for a data set or a node), ``--pause EPOCH:S`` sleeps S seconds after that epoch
(a checkpoint upload, a shard fetch). SIGINT ends training at the end of the current batch and
the job exits 0 with its log complete (what Governor's finish-at-convergence sends).

``--checkpoint-dir DIR`` makes the job movable by its own checkpoint, as a cluster job submitted
with ``govctl submit --checkpoint-dir DIR`` must be: Keras's ``BackupAndRestore`` saves every
epoch to DIR and resumes from it when the job is started again; SIGUSR1 (the node's save signal)
ends training at the end of the current epoch (its backup written) and the job exits 0.

``--probe TASK[,TASK...]`` trains nothing to the end: it times a few epochs of each task alone and
prints ``{"TASK": seconds_per_epoch, ...}``, so that the demo sizes its jobs to this machine.
"""
import argparse
import json
import os
import resource
import signal
import sys
import time

STARTED = time.time()
parser = argparse.ArgumentParser()
parser.add_argument("--task", default="digits")
parser.add_argument("--epochs", type=int, default=30)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--batch", type=int, default=64)
parser.add_argument("--width", type=int, default=256)
parser.add_argument("--samples", type=int, default=6000)
parser.add_argument("--threads", default="0", help="TF intra-op threads (0: TF default; 'env': GOVERNOR_CORES, the size an elastic job was started at)")
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--log", default="")
parser.add_argument("--probe", default="", help="TASK[,TASK...]: time epochs of each task alone, print JSON")
parser.add_argument("--summary", default="")
parser.add_argument("--times", default="", help="side file: 'epoch unix_time loss val_loss' per epoch")
parser.add_argument("--quiet-start", type=float, default=0.0)
parser.add_argument("--pause", default="", help="EPOCH:SECONDS")
parser.add_argument("--checkpoint-dir", default="", help="save every epoch here, resume from it; SIGUSR1 saves and exits 0")
args = parser.parse_args()
if not args.log and not args.probe:
    parser.error("--log is required")

if args.quiet_start > 0:
    time.sleep(args.quiet_start)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

if args.threads == "env":
    # An elastic job: the coordinator starts it (and every resize restarts it) with its size.
    args.threads = int(os.environ.get("GOVERNOR_CORES", "0") or 0)
else:
    args.threads = int(args.threads)
if args.threads > 0:
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(max(1, args.threads // 2))
keras.utils.set_random_seed(args.seed)
rng = np.random.default_rng(args.seed)


def digits(upsample):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = x.astype("float32") / 16.0
    # Light augmentation to a few thousand samples: noisy copies of the originals.
    reps = max(1, args.samples // len(x))
    x = np.concatenate([x + rng.normal(0, 0.15, x.shape).astype("float32") for _ in range(reps)])
    y = np.concatenate([y] * reps)
    if upsample:
        x = x.reshape(-1, 8, 8, 1).repeat(2, axis=1).repeat(2, axis=2)
    return x, keras.utils.to_categorical(y, 10)


def teacher():
    d = 32
    x = rng.normal(size=(args.samples, d)).astype("float32")
    w1 = rng.normal(size=(d, 64)) / np.sqrt(d)
    w2 = rng.normal(size=(64, 1)) / 8.0
    y = (np.tanh(x @ w1) @ w2).astype("float32") + rng.normal(0, 0.02, (args.samples, 1)).astype("float32")
    return x, y


def make(task):
    """The data and the compiled model of a task."""
    if task == "digits":
        x, y = digits(False)
        model = keras.Sequential([
            keras.Input((64,)),
            keras.layers.Dense(args.width, activation="relu"),
            keras.layers.Dense(args.width, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        loss = "categorical_crossentropy"
    elif task == "digits_cnn":
        x, y = digits(True)
        model = keras.Sequential([
            keras.Input((16, 16, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(args.width, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ])
        loss = "categorical_crossentropy"
    elif task == "teacher":
        x, y = teacher()
        model = keras.Sequential([
            keras.Input((x.shape[1],)),
            keras.layers.Dense(args.width, activation="tanh"),
            keras.layers.Dense(args.width, activation="tanh"),
            keras.layers.Dense(1),
        ])
        loss = "mse"
    else:
        sys.exit(f"unknown task {task}")

    model.compile(optimizer=keras.optimizers.Adam(args.lr), loss=loss)
    return x, y, model


if args.probe:
    per_epoch = {}
    for task in args.probe.split(","):
        x, y, model = make(task)
        # The first epoch traces the graph: not what an epoch costs.
        model.fit(x, y, epochs=1, batch_size=args.batch, validation_split=0.2, verbose=0)
        t0 = time.time()
        model.fit(x, y, epochs=3, batch_size=args.batch, validation_split=0.2, verbose=0)
        per_epoch[task] = (time.time() - t0) / 3
    print(json.dumps(per_epoch))
    sys.exit(0)

x, y, model = make(args.task)

stop = {"asked": False, "save": False}


class Control(keras.callbacks.Callback):
    """Ends training cleanly on SIGINT; sleeps where --pause says."""

    def on_train_batch_end(self, batch, logs=None):
        if stop["asked"]:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        if stop["save"]:
            # BackupAndRestore (first in the list) has written this epoch.
            self.model.stop_training = True
        if times is not None:
            logs = logs or {}
            times.write(f"{epoch + 1} {time.time():.3f} {logs.get('loss', float('nan'))} {logs.get('val_loss', float('nan'))}\n")
            times.flush()
        if args.pause:
            at, secs = args.pause.split(":")
            if epoch + 1 == int(at):
                time.sleep(float(secs))


def on_sigint(signum, frame):
    stop["asked"] = True


def on_sigusr1(signum, frame):
    stop["save"] = True


signal.signal(signal.SIGINT, on_sigint)
signal.signal(signal.SIGUSR1, on_sigusr1)
times = open(args.times, "a", buffering=1) if args.times else None
# A resumed job appends to its log: the epochs before the move stay in it.
callbacks = [keras.callbacks.CSVLogger(args.log, append=bool(args.checkpoint_dir)), Control()]
if args.checkpoint_dir:
    # Kept at the end of training: the node tells a save from the job's own end by it.
    callbacks.insert(0, keras.callbacks.BackupAndRestore(args.checkpoint_dir, delete_checkpoint=False))
history = model.fit(
    x,
    y,
    epochs=args.epochs,
    batch_size=args.batch,
    validation_split=0.2,
    verbose=0,
    callbacks=callbacks,
)
if args.summary:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(args.summary, "w") as f:
        json.dump(
            {
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "epochs_done": len(history.history.get("loss", [])),
                "stopped_early": stop["asked"],
                "saved_for_a_move": stop["save"],
                "wall_seconds": time.time() - STARTED,
                "ended_at": time.time(),
            },
            f,
        )
