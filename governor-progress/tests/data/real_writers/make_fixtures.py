"""Writes the real-writer fixtures of governor-progress: small logs of real (tiny) training
loops, written by the logging back-ends themselves, never by hand.

    python make_fixtures.py OUT_DIR            # every fixture
    python make_fixtures.py OUT_DIR NAME...    # some of them

`cargo xtask writer-fixtures` runs it in the project's Python environment (PyPI packages pinned
in xtask/src/writers.rs) and copies the result to governor-progress/tests/data/real_writers/.
Each fixture is a directory, as the job's `--log` would name it:

- pytorch_summarywriter/  torch.utils.tensorboard.SummaryWriter (simple_value scalars):
  `Loss/train` every step, `Loss/val` every 10 steps; the run is restarted from its step-30
  checkpoint by a second writer (a second event file whose steps go back).
- keras_tensorboard/      keras.callbacks.TensorBoard (TF2 tensor summaries, scalars plug-in):
  `train/` and `validation/` runs, `epoch_loss` per epoch.
- lightning_tensorboard/  Lightning's default logger (TensorBoardLogger): `version_0/` and a
  from-scratch restart in `version_1/`.
- mlflow_sqlite/          mlflow.keras.autolog() with MLflow's default store (sqlite mlflow.db).
- mlflow_file/            MLflow's file store (mlruns/), a manual loop logging `loss` and
  `val_loss`, resumed (same run id) from a checkpoint taken before its last logged step: the
  resumed run repeats that step.
- keras_jsonl/            the JSON-lines logger of Keras' LambdaCallback documentation, with a
  checkpoint every second epoch; killed after logging epoch 3 and resumed (`initial_epoch`) from
  the epoch-2 checkpoint, the run logs epoch 3 again: a repeated, not decreasing, counter.

Host names and process ids in event file names are replaced by `fixture` and a counter, so that
the files do not say where they were made; the bytes inside are the writers'.
"""

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

SEED = 0


def rename_event_files(root: Path) -> None:
    """events.out.tfevents.<time>.<host>.<pid>.<n>[.v2] -> events.out.tfevents.<time>.fixture.<k>"""
    k = 0
    for p in sorted(root.rglob("*tfevents*")):
        parts = p.name.split(".")
        # ["events", "out", "tfevents", time, ...]
        p.rename(p.with_name(".".join(parts[:4] + ["fixture", str(k)])))
        k += 1


def pytorch_summarywriter(out: Path) -> None:
    import torch
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(SEED)
    logdir = out / "pytorch_summarywriter"
    x = torch.randn(256, 8)
    y = x @ torch.randn(8, 1) + 0.1 * torch.randn(256, 1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def train(writer, start, end):
        for step in range(start, end):
            idx = torch.randint(0, 256, (32,))
            loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.add_scalar("Loss/train", loss.item(), step)
            if step % 10 == 9:
                with torch.no_grad():
                    writer.add_scalar("Loss/val", torch.nn.functional.mse_loss(model(x), y).item(), step)

    first = SummaryWriter(str(logdir))
    train(first, 0, 30)
    checkpoint = ({k: v.clone() for k, v in model.state_dict().items()}, opt.state_dict())
    train(first, 30, 40)
    first.close()  # the job dies here; it is restarted from its step-30 checkpoint
    time.sleep(1.1)  # the second file's name carries a later second
    model.load_state_dict(checkpoint[0])
    opt.load_state_dict(checkpoint[1])
    second = SummaryWriter(str(logdir))
    train(second, 30, 60)
    second.close()
    rename_event_files(logdir)


def keras_model():
    import keras
    import numpy as np

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    x = rng.random((512, 8), dtype=np.float32)
    y = (x.sum(axis=1) > 4.0).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model, x, y


def keras_tensorboard(out: Path) -> None:
    import keras

    model, x, y = keras_model()
    logdir = out / "keras_tensorboard"
    model.fit(
        x, y, epochs=6, batch_size=64, validation_split=0.25, verbose=0,
        callbacks=[keras.callbacks.TensorBoard(log_dir=str(logdir))],
    )
    rename_event_files(logdir)


def lightning_tensorboard(out: Path) -> None:
    import lightning as L
    import torch

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    root = out / "lightning_tensorboard"
    for _run in range(2):  # the second run restarts from scratch: lightning_logs/version_1
        L.seed_everything(SEED, verbose=False)
        x = torch.randn(256, 8)
        y = x @ torch.randn(8, 1)
        data = torch.utils.data.TensorDataset(x, y)
        train = torch.utils.data.DataLoader(data, batch_size=32)
        val = torch.utils.data.DataLoader(data, batch_size=128)
        trainer = L.Trainer(
            max_epochs=3, default_root_dir=str(root), log_every_n_steps=4,
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            accelerator="cpu", devices=1,
        )
        trainer.fit(Regressor(), train, val)
        time.sleep(1.1)
    for p in root.rglob("hparams.yaml"):
        p.unlink()
    rename_event_files(root)


def mlflow_sqlite(out: Path) -> None:
    import mlflow

    model, x, y = keras_model()
    here = out / "mlflow_sqlite"
    here.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(here)  # MLflow's default store: sqlite:///mlflow.db in the working directory
    try:
        mlflow.keras.autolog(log_models=False)
        model.fit(x, y, epochs=6, batch_size=64, validation_split=0.25, verbose=0)
        mlflow.end_run()
    finally:
        os.chdir(cwd)
    for extra in here.iterdir():
        if extra.name != "mlflow.db":
            shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
    # MLflow 3's schema is ~65 empty tables and their indexes, a 4 KiB page each: the same
    # database with 512-byte pages is a seventh of the size (rows and schema untouched).
    con = sqlite3.connect(here / "mlflow.db")
    con.execute("PRAGMA page_size = 512")
    con.execute("VACUUM")
    con.close()


def mlflow_file(out: Path) -> None:
    import mlflow
    import numpy as np

    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    root = out / "mlflow_file" / "mlruns"
    mlflow.set_tracking_uri(root.resolve().as_uri())
    rng = np.random.default_rng(SEED)
    w = np.zeros(4)
    xs = rng.normal(size=(128, 4))
    ys = xs @ np.array([1.0, -2.0, 0.5, 3.0])

    def train(start, end):
        nonlocal w
        for step in range(start, end):
            i = rng.integers(0, 128, 16)
            grad = 2 * xs[i].T @ (xs[i] @ w - ys[i]) / 16
            w = w - 0.05 * grad
            mlflow.log_metric("loss", float(np.mean((xs[i] @ w - ys[i]) ** 2)), step=step)
            if step % 5 == 4:
                mlflow.log_metric("val_loss", float(np.mean((xs @ w - ys) ** 2)), step=step)

    with mlflow.start_run() as run:
        train(0, 19)
        checkpoint = w.copy()  # saved before step 19
        train(19, 20)
    w = checkpoint  # the job dies after logging step 19 and resumes from the checkpoint
    with mlflow.start_run(run_id=run.info.run_id):
        train(19, 30)
    # Only the metrics and each run's meta.yaml are kept (tags name the user and the script).
    for p in list(root.rglob("*")):
        if p.is_dir() and p.name in ("artifacts", "tags", "params", "inputs"):
            shutil.rmtree(p)


def keras_jsonl(out: Path) -> None:
    import keras

    model, x, y = keras_model()
    here = out / "keras_jsonl"
    here.mkdir(parents=True)
    log_path = here / "loss_log.json"
    # As in the documentation of keras.callbacks.LambdaCallback.
    json_log = open(log_path, mode="a", buffering=1)
    logger = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: json_log.write(
            json.dumps({"epoch": epoch, "loss": logs["loss"], "val_loss": logs["val_loss"]}) + "\n"
        ),
    )
    saved = {}

    def checkpoint(epoch, _logs):
        if epoch % 2 == 0:  # a checkpoint every second epoch
            saved["weights"] = model.get_weights()
            saved["epoch"] = epoch

    keeper = keras.callbacks.LambdaCallback(on_epoch_end=checkpoint)
    model.fit(x, y, epochs=4, batch_size=64, validation_split=0.25, verbose=0, callbacks=[keeper, logger])
    # Killed after epoch 3 was logged; resumed from the checkpoint of epoch 2: epoch 3 again.
    model.set_weights(saved["weights"])
    model.fit(
        x, y, initial_epoch=saved["epoch"] + 1, epochs=7, batch_size=64, validation_split=0.25,
        verbose=0, callbacks=[logger],
    )
    json_log.close()


FIXTURES = {
    f.__name__: f
    for f in [
        pytorch_summarywriter, keras_tensorboard, lightning_tensorboard, mlflow_sqlite,
        mlflow_file, keras_jsonl,
    ]
}


def main() -> None:
    out = Path(sys.argv[1])
    names = sys.argv[2:] or list(FIXTURES)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    out.mkdir(parents=True, exist_ok=True)
    if len(names) > 1:
        # One process per fixture: autologging and tracking URIs are process-wide.
        for name in names:
            subprocess.run([sys.executable, __file__, str(out), name], check=True)
        return
    name = names[0]
    if (out / name).exists():
        shutil.rmtree(out / name)
    started = time.time()
    FIXTURES[name](out)
    print(f"{name}: {time.time() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
