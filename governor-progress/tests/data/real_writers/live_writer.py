"""A small real training job that logs only through one tracking back-end, slowly enough to be
followed live. Used by the live tests (the watcher following a real writer; `governor run-job`
governing such jobs):

    python live_writer.py pytorch   LOGDIR [STEPS] [SECONDS_PER_STEP]
    python live_writer.py keras     LOGDIR [EPOCHS] [SECONDS_PER_EPOCH]
    python live_writer.py lightning ROOTDIR [EPOCHS] [SECONDS_PER_STEP]
    python live_writer.py mlflow    WORKDIR [EPOCHS] [SECONDS_PER_EPOCH]

After each value reaches the file (the writer flushed it or committed it), a line
`logged STEP TIME` goes to stdout, TIME being time.time(): the test measures from there how
long the follower took. Nothing else is logged anywhere (no CSV, no progress bar).
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def say(step):
    print(f"logged {step} {time.time():.6f}", flush=True)


def pytorch(logdir, steps, pause):
    import torch
    from torch.utils.tensorboard import SummaryWriter

    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    writer = SummaryWriter(logdir)
    for step in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        writer.add_scalar("Loss/train", loss.item(), step)
        writer.flush()
        say(step)
        time.sleep(pause)
    writer.close()


def keras_data():
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.random((2048, 8), dtype=np.float32)
    y = (x.sum(axis=1) > 4.0).astype("float32")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model, x, y


def slow_epochs(pause):
    import keras

    return keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: (say(epoch), time.sleep(pause))
    )


def keras_tb(logdir, epochs, pause):
    import keras

    model, x, y = keras_data()
    model.fit(
        x, y, epochs=epochs, batch_size=64, validation_split=0.25, verbose=0,
        callbacks=[keras.callbacks.TensorBoard(log_dir=logdir), slow_epochs(pause)],
    )


def lightning(root, epochs, pause):
    import lightning as L
    import torch

    class Regressor(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            time.sleep(pause)
            return loss

        def validation_step(self, batch, _):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.02)

    L.seed_everything(0, verbose=False)
    x = torch.randn(512, 8)
    y = x @ torch.randn(8, 1)
    data = torch.utils.data.TensorDataset(x, y)
    trainer = L.Trainer(
        max_epochs=epochs, default_root_dir=root, log_every_n_steps=1, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1,
    )
    trainer.fit(
        Regressor(), torch.utils.data.DataLoader(data, batch_size=32), torch.utils.data.DataLoader(data, batch_size=256)
    )


def mlflow_keras(workdir, epochs, pause):
    import mlflow

    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)  # MLflow's default store: sqlite:///mlflow.db here
    mlflow.keras.autolog(log_models=False)
    model, x, y = keras_data()
    model.fit(x, y, epochs=epochs, batch_size=64, validation_split=0.25, verbose=0, callbacks=[slow_epochs(pause)])
    mlflow.end_run()


def main():
    kind, where = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 30
    pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
    {"pytorch": pytorch, "keras": keras_tb, "lightning": lightning, "mlflow": mlflow_keras}[kind](where, n, pause)


if __name__ == "__main__":
    main()
