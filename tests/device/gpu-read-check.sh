#!/usr/bin/env bash
# A read-only check of the daemon's NVML path on a machine with a real NVIDIA GPU (run by hand
# where one is lent; CI has none): two real training processes (PyTorch Lightning with its
# CSVLogger, and a plain PyTorch loop printing `Epoch [e/N], Step [s/M], Loss: x`) run on the
# GPU while `governor gpus` reads the inventory, each compute process with its cgroup and the
# energy counter; then `governor parse --summary` reads both logs. It changes no device
# setting: the only NVML calls are reads, every nvidia-smi call is a query, and nvidia-smi's
# power limit, clocks, persistence and MIG modes are recorded before and after to show it.
#
# It records what it saw in OUT, then judges it (gpu_read_verdict.py beside this script): PASS
# or FAIL for each check (both processes found, their memory within 5% of nvidia-smi's, their
# cgroups, energy counted over two intervals, both logs parsed with a loss, both trainings
# ended well, settings unchanged) and exits non-zero when any fails.
#
#   GOVERNOR_BIN=target/release/governor OUT=/tmp/check tests/device/gpu-read-check.sh
#   tests/device/gpu-read-check.sh --verdict /tmp/check    # judge a recorded OUT again
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--verdict" ]; then
    exec python3 "$HERE/gpu_read_verdict.py" "${2:?usage: $0 --verdict OUT_DIR}"
fi
GOV=${GOVERNOR_BIN:-target/release/governor}
OUT=${OUT:-/tmp/gpu-read-check}
WORK=$(mktemp -d)
mkdir -p "$OUT"
settings() {
    nvidia-smi --query-gpu=index,name,uuid,power.limit,power.default_limit,clocks.max.sm,clocks.applications.graphics,persistence_mode,mig.mode.current --format=csv,noheader
}
settings > "$OUT/settings-before.csv"
cat > "$WORK/lit.py" <<'PY'
import sys, torch, lightning as L
from lightning.pytorch.loggers import CSVLogger
torch.manual_seed(0)
x = torch.randn(65536, 256); y = (x[:, :8].sum(1) > 0).long()
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256, shuffle=True)
class M(L.LightningModule):
    def __init__(s):
        super().__init__(); s.net = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2))
    def training_step(s, b, i):
        loss = torch.nn.functional.cross_entropy(s.net(b[0]), b[1]); s.log("train_loss", loss, on_step=True, on_epoch=True); return loss
    def configure_optimizers(s): return torch.optim.SGD(s.parameters(), lr=0.05)
t = L.Trainer(max_epochs=int(sys.argv[2]), accelerator="gpu", devices=1, logger=CSVLogger(sys.argv[1], name="run"), log_every_n_steps=20, enable_progress_bar=False, enable_checkpointing=False)
t.fit(M(), data)
PY
cat > "$WORK/plain.py" <<'PY'
import sys, torch
torch.manual_seed(1)
dev = "cuda"; epochs = int(sys.argv[1])
x = torch.randn(32768, 512, device=dev); y = (x[:, :4].sum(1) > 0).long()
net = torch.nn.Sequential(torch.nn.Linear(512, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2)).to(dev)
opt = torch.optim.SGD(net.parameters(), lr=0.05); steps = 128
for e in range(epochs):
    perm = torch.randperm(32768, device=dev)
    for s in range(steps):
        i = perm[s * 256:(s + 1) * 256]
        loss = torch.nn.functional.cross_entropy(net(x[i]), y[i]); opt.zero_grad(); loss.backward(); opt.step()
        if (s + 1) % 32 == 0:
            print(f"Epoch [{e + 1}/{epochs}], Step [{s + 1}/{steps}], Loss: {loss.item():.4f}", flush=True)
    torch.cuda.synchronize()
PY
( cd "$WORK" && exec python3 lit.py "$WORK/lightning" 40 > "$OUT/lightning.out" 2>&1 ) &
LIT=$!
( exec python3 "$WORK/plain.py" 300 > "$OUT/plain.log" 2> "$OUT/plain.err" ) &
PLAIN=$!
printf 'lightning %s\nplain %s\n' "$LIT" "$PLAIN" > "$OUT/pids.txt"
# Both on the GPU (CUDA start-up takes seconds), then read.
for _ in $(seq 60); do
    n=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | wc -l)
    [ "$n" -ge 2 ] && break
    sleep 1
done
cat "/proc/$LIT/cgroup" > "$OUT/cgroup-lightning.txt"
cat "/proc/$PLAIN/cgroup" > "$OUT/cgroup-plain.txt"
"$GOV" gpus --interval 3s > "$OUT/gpus.txt" 2>&1; echo "rc=$?" >> "$OUT/gpus.txt"
# Two reads one after the other: the energy counter must grow over each interval. nvidia-smi's
# per-process memory is read right after the first, to compare with governor's.
"$GOV" gpus --interval 5s --json > "$OUT/gpus-1.json" 2> "$OUT/gpus-1.err"; echo $? > "$OUT/gpus-1.rc"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$OUT/apps-1.csv"
"$GOV" gpus --interval 2s --json > "$OUT/gpus-2.json" 2> "$OUT/gpus-2.err"; echo $? > "$OUT/gpus-2.rc"
wait "$LIT"; echo "lightning $?" > "$OUT/trained.txt"
wait "$PLAIN"; echo "plain $?" >> "$OUT/trained.txt"
cp "$WORK"/lightning/run/version_0/metrics.csv "$OUT/lightning-metrics.csv" 2>/dev/null
"$GOV" parse --summary "$OUT/lightning-metrics.csv" > "$OUT/parse-lightning.json" 2> "$OUT/parse-lightning.err"
echo $? > "$OUT/parse-lightning.rc"
"$GOV" parse --summary "$OUT/plain.log" > "$OUT/parse-plain.json" 2> "$OUT/parse-plain.err"
echo $? > "$OUT/parse-plain.rc"
"$GOV" gpus --interval 1s > "$OUT/gpus-idle.txt" 2>&1
settings > "$OUT/settings-after.csv"
rm -rf "$WORK"
cat "$OUT/gpus.txt"
exec python3 "$HERE/gpu_read_verdict.py" "$OUT"
