//! `demo-trainer`: a real, CPU-bound training job for the demo and the VM tests.
//!
//! It trains a two-layer perceptron (tanh hidden layer, sigmoid output, binary cross-entropy) by
//! mini-batch stochastic gradient descent on a synthetic classification problem whose labels come
//! from a fixed random "teacher" network plus label noise. The loss it logs is the real training
//! loss of that model: it falls fast at first and flattens as the student approaches the teacher,
//! like a real training run. Gradients of a batch can be computed by several threads.
//!
//! It writes its progress in a real framework's format (`--format`):
//! `keras-csv` (Keras CSVLogger), `lightning-csv` (Lightning CSVLogger metrics.csv), `hf-console`
//! (Hugging Face Trainer console dicts) or `pytorch-print` (`Epoch [3/50], Step [..], Loss: ...`).
//!
//! ```text
//! demo-trainer --log /tmp/job1.csv --format keras-csv --epochs 60 --seed 1 [--threads 2]
//! ```
//!
//! With `--checkpoint-dir DIR` it behaves like a framework with a checkpoint callback (Keras
//! `BackupAndRestore`): on SIGUSR1 it finishes the epoch under way, saves its whole state
//! (epoch, weights, generator, sample order; floats as their exact bits) to `DIR/state.json`
//! and exits with status 0; started again with the same arguments it resumes from that state,
//! appending to its log. A moved run therefore ends with the same loss, bit for bit, as a run
//! that was never interrupted. `--pause-ms N` sleeps N ms after each epoch (a slower job for
//! the tests, without changing a single number). `--ballast-mib N` adds N MiB of state (like
//! optimizer moments), rewritten in part every epoch and saved with the checkpoint, to measure
//! what a move costs against the size of a job's state.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    log: PathBuf,
    format: String,
    epochs: usize,
    samples: usize,
    features: usize,
    hidden: usize,
    batch: usize,
    learning_rate: f64,
    seed: u64,
    threads: usize,
    log_every_steps: usize,
    checkpoint_dir: Option<PathBuf>,
    pause_ms: u64,
    ballast_mib: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: demo-trainer --log PATH [--format keras-csv|lightning-csv|hf-console|pytorch-print] \
         [--epochs N] [--samples N] [--features N] [--hidden N] [--batch N] [--lr X] [--seed N] [--threads N] [--log-every-steps N] \
         [--checkpoint-dir DIR] [--pause-ms N] [--ballast-mib N]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut a = Args {
        log: PathBuf::new(),
        format: "keras-csv".into(),
        epochs: 40,
        samples: 4096,
        features: 24,
        hidden: 48,
        batch: 64,
        learning_rate: 0.05,
        seed: 1,
        threads: 1,
        log_every_steps: 16,
        checkpoint_dir: None,
        pause_ms: 0,
        ballast_mib: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--log" => a.log = PathBuf::from(val()),
            "--format" => a.format = val(),
            "--epochs" => a.epochs = val().parse().unwrap_or_else(|_| usage()),
            "--samples" => a.samples = val().parse().unwrap_or_else(|_| usage()),
            "--features" => a.features = val().parse().unwrap_or_else(|_| usage()),
            "--hidden" => a.hidden = val().parse().unwrap_or_else(|_| usage()),
            "--batch" => a.batch = val().parse().unwrap_or_else(|_| usage()),
            "--lr" => a.learning_rate = val().parse().unwrap_or_else(|_| usage()),
            "--seed" => a.seed = val().parse().unwrap_or_else(|_| usage()),
            "--threads" => a.threads = val().parse().unwrap_or_else(|_| usage()),
            "--log-every-steps" => a.log_every_steps = val().parse().unwrap_or_else(|_| usage()),
            "--checkpoint-dir" => a.checkpoint_dir = Some(PathBuf::from(val())),
            "--pause-ms" => a.pause_ms = val().parse().unwrap_or_else(|_| usage()),
            "--ballast-mib" => a.ballast_mib = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if a.log.as_os_str().is_empty() || a.threads == 0 || a.batch == 0 || a.samples < a.batch {
        usage();
    }
    a
}

/// SplitMix64: a small, good-enough deterministic generator (no dependency needed).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform().max(1e-300), self.uniform());
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// A two-layer perceptron: `p = sigmoid(w2 . tanh(W1 x + b1) + b2)`.
#[derive(Clone)]
struct Mlp {
    features: usize,
    hidden: usize,
    w1: Vec<f64>, // hidden x features, row-major
    b1: Vec<f64>,
    w2: Vec<f64>,
    b2: f64,
}

impl Mlp {
    fn random(features: usize, hidden: usize, scale: f64, rng: &mut Rng) -> Mlp {
        let s1 = scale / (features as f64).sqrt();
        let s2 = scale / (hidden as f64).sqrt();
        Mlp {
            features,
            hidden,
            w1: (0..hidden * features).map(|_| rng.normal() * s1).collect(),
            b1: (0..hidden).map(|_| rng.normal() * 0.1).collect(),
            w2: (0..hidden).map(|_| rng.normal() * s2).collect(),
            b2: 0.0,
        }
    }

    fn zeros_like(&self) -> Mlp {
        Mlp {
            features: self.features,
            hidden: self.hidden,
            w1: vec![0.0; self.w1.len()],
            b1: vec![0.0; self.b1.len()],
            w2: vec![0.0; self.w2.len()],
            b2: 0.0,
        }
    }

    /// Forward pass; fills `h` with the hidden activations and returns the logit.
    // Index loops: the same `j` addresses rows of w1 and entries of b1, w2 and h.
    #[allow(clippy::needless_range_loop)]
    fn forward(&self, x: &[f64], h: &mut [f64]) -> f64 {
        let mut z = self.b2;
        for j in 0..self.hidden {
            let row = &self.w1[j * self.features..(j + 1) * self.features];
            let a: f64 = row.iter().zip(x).map(|(w, v)| w * v).sum::<f64>() + self.b1[j];
            h[j] = a.tanh();
            z += self.w2[j] * h[j];
        }
        z
    }

    /// Accumulate the gradient of the mean BCE loss over `idx` into `g`; return (loss sum, correct).
    #[allow(clippy::needless_range_loop)]
    fn accumulate(&self, data: &Dataset, idx: &[usize], g: &mut Mlp) -> (f64, usize) {
        let mut h = vec![0.0; self.hidden];
        let (mut loss, mut correct) = (0.0, 0);
        for &i in idx {
            let x = data.x(i);
            let y = data.y[i];
            let z = self.forward(x, &mut h);
            let p = 1.0 / (1.0 + (-z).exp());
            loss += -(y * p.max(1e-12).ln() + (1.0 - y) * (1.0 - p).max(1e-12).ln());
            if (p >= 0.5) == (y >= 0.5) {
                correct += 1;
            }
            let dz = p - y;
            g.b2 += dz;
            for j in 0..self.hidden {
                g.w2[j] += dz * h[j];
                let da = dz * self.w2[j] * (1.0 - h[j] * h[j]);
                g.b1[j] += da;
                let grow = &mut g.w1[j * self.features..(j + 1) * self.features];
                for (gw, v) in grow.iter_mut().zip(x) {
                    *gw += da * v;
                }
            }
        }
        (loss, correct)
    }

    fn add_scaled(&mut self, g: &Mlp, s: f64) {
        for (w, d) in self.w1.iter_mut().zip(&g.w1) {
            *w += s * d;
        }
        for (w, d) in self.b1.iter_mut().zip(&g.b1) {
            *w += s * d;
        }
        for (w, d) in self.w2.iter_mut().zip(&g.w2) {
            *w += s * d;
        }
        self.b2 += s * g.b2;
    }

    fn merge(&mut self, g: &Mlp) {
        self.add_scaled(g, 1.0);
    }
}

struct Dataset {
    features: usize,
    xs: Vec<f64>,
    y: Vec<f64>,
}

impl Dataset {
    /// Labels from a random teacher network, with 5% of them flipped (irreducible loss).
    fn synthetic(samples: usize, features: usize, seed: u64) -> Dataset {
        let mut rng = Rng(seed ^ 0xDA7A);
        let teacher = Mlp::random(features, 16, 2.5, &mut rng);
        let xs: Vec<f64> = (0..samples * features).map(|_| rng.normal()).collect();
        let mut h = vec![0.0; 16];
        let y = (0..samples)
            .map(|i| {
                let z = teacher.forward(&xs[i * features..(i + 1) * features], &mut h);
                let label = if z > 0.0 { 1.0 } else { 0.0 };
                if rng.uniform() < 0.05 {
                    1.0 - label
                } else {
                    label
                }
            })
            .collect();
        Dataset { features, xs, y }
    }

    fn x(&self, i: usize) -> &[f64] {
        &self.xs[i * self.features..(i + 1) * self.features]
    }
}

/// Writes progress lines in one framework's format, flushing each line as frameworks do.
struct ProgressLog {
    out: BufWriter<File>,
    format: String,
    epochs: usize,
    steps_per_epoch: usize,
}

impl ProgressLog {
    /// A new log, or (resuming) the existing one continued.
    fn open(
        path: &PathBuf,
        format: &str,
        epochs: usize,
        steps_per_epoch: usize,
        resume: bool,
    ) -> std::io::Result<ProgressLog> {
        let file = if resume {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?
        } else {
            File::create(path)?
        };
        let mut out = BufWriter::new(file);
        match format {
            _ if resume => {}
            "keras-csv" => writeln!(out, "epoch,accuracy,loss")?,
            "lightning-csv" => writeln!(out, "epoch,step,train_loss,train_acc")?,
            "hf-console" | "pytorch-print" => {}
            other => {
                eprintln!("demo-trainer: unknown --format {other}");
                std::process::exit(2);
            }
        }
        out.flush()?;
        Ok(ProgressLog {
            out,
            format: format.into(),
            epochs,
            steps_per_epoch,
        })
    }

    /// A record every `log_every_steps` optimisation steps (Lightning, HF, PyTorch prints).
    fn step(&mut self, epoch: usize, step: usize, loss: f64, acc: f64) -> std::io::Result<()> {
        let global = epoch * self.steps_per_epoch + step;
        match self.format.as_str() {
            "lightning-csv" => writeln!(self.out, "{epoch},{global},{loss},{acc}")?,
            "hf-console" => {
                let frac = global as f64 / self.steps_per_epoch as f64;
                writeln!(
                    self.out,
                    "{{'loss': {loss:.4}, 'grad_norm': 1.0, 'learning_rate': 0.05, 'epoch': {frac:.2}}}"
                )?
            }
            "pytorch-print" => writeln!(
                self.out,
                "Epoch [{}/{}], Step [{}/{}], Loss: {loss:.4}",
                epoch + 1,
                self.epochs,
                step + 1,
                self.steps_per_epoch
            )?,
            _ => return Ok(()),
        }
        self.out.flush()
    }

    /// A record at the end of every epoch (Keras CSVLogger).
    fn epoch(&mut self, epoch: usize, loss: f64, acc: f64) -> std::io::Result<()> {
        if self.format == "keras-csv" {
            writeln!(self.out, "{epoch},{acc},{loss}")?;
            self.out.flush()?;
        }
        Ok(())
    }
}

/// Set by SIGUSR1: save at the end of the epoch under way, then exit.
static SAVE_ASKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_save_signal(_: libc::c_int) {
    SAVE_ASKED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Everything a run needs to go on exactly where it stopped.
#[derive(serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    /// The next epoch to run.
    epoch: usize,
    rng: u64,
    order: Vec<usize>,
    /// f64 values as their bits, so that nothing is rounded.
    w1: Vec<u64>,
    b1: Vec<u64>,
    w2: Vec<u64>,
    b2: u64,
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn floats(v: &[u64]) -> Vec<f64> {
    v.iter().map(|b| f64::from_bits(*b)).collect()
}

/// Write the state atomically (a crash mid-save leaves the previous one): the ballast first,
/// then the state that names the epoch.
fn save(dir: &std::path::Path, c: &Checkpoint, ballast: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    if !ballast.is_empty() {
        let tmp = dir.join("ballast.bin.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(ballast)?;
        f.sync_all()?;
        std::fs::rename(tmp, dir.join("ballast.bin"))?;
    }
    let tmp = dir.join("state.json.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(c).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(tmp, dir.join("state.json"))
}

fn load(dir: &std::path::Path) -> std::io::Result<Option<Checkpoint>> {
    match std::fs::read(dir.join("state.json")) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(std::io::Error::other),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn main() -> std::io::Result<()> {
    let a = parse_args();
    let data = Dataset::synthetic(a.samples, a.features, a.seed);
    let mut rng = Rng(a.seed);
    let mut model = Mlp::random(a.features, a.hidden, 1.0, &mut rng);
    let steps_per_epoch = a.samples / a.batch;
    let mut order: Vec<usize> = (0..a.samples).collect();
    let mut first_epoch = 0;
    // Extra state: from the checkpoint when resuming, else deterministic from the seed.
    let mut ballast: Vec<u8> = Vec::new();
    if let Some(dir) = &a.checkpoint_dir {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                libc::SIGUSR1,
                on_save_signal as *const () as libc::sighandler_t,
            );
        }
        if let Some(c) = load(dir)? {
            first_epoch = c.epoch;
            rng = Rng(c.rng);
            order = c.order;
            model.w1 = floats(&c.w1);
            model.b1 = floats(&c.b1);
            model.w2 = floats(&c.w2);
            model.b2 = f64::from_bits(c.b2);
            if a.ballast_mib > 0 {
                ballast = std::fs::read(dir.join("ballast.bin"))?;
            }
            println!(
                "demo-trainer: resuming at epoch {first_epoch} from {}",
                dir.display()
            );
        }
    }
    if ballast.is_empty() && a.ballast_mib > 0 {
        let mut r = Rng(a.seed ^ 0xBA11);
        ballast = (0..a.ballast_mib * (1 << 20) / 8)
            .flat_map(|_| r.next_u64().to_le_bytes())
            .collect();
    }
    let mut log = ProgressLog::open(
        &a.log,
        &a.format,
        a.epochs,
        steps_per_epoch,
        first_epoch > 0,
    )?;
    let started = Instant::now();
    for epoch in first_epoch..a.epochs {
        // Fisher-Yates shuffle per epoch.
        for i in (1..order.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let (mut epoch_loss, mut epoch_correct) = (0.0, 0);
        let (mut window_loss, mut window_correct, mut window_n) = (0.0, 0, 0);
        for step in 0..steps_per_epoch {
            let batch = &order[step * a.batch..(step + 1) * a.batch];
            let chunk = batch.len().div_ceil(a.threads);
            let parts: Vec<(Mlp, f64, usize)> = std::thread::scope(|s| {
                let handles: Vec<_> = batch
                    .chunks(chunk)
                    .map(|idx| {
                        let model = &model;
                        let data = &data;
                        s.spawn(move || {
                            let mut g = model.zeros_like();
                            let (l, c) = model.accumulate(data, idx, &mut g);
                            (g, l, c)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("gradient thread panicked"))
                    .collect()
            });
            let mut grad = model.zeros_like();
            let (mut loss, mut correct) = (0.0, 0);
            for (g, l, c) in &parts {
                grad.merge(g);
                loss += l;
                correct += c;
            }
            model.add_scaled(&grad, -a.learning_rate / batch.len() as f64);
            epoch_loss += loss;
            epoch_correct += correct;
            window_loss += loss;
            window_correct += correct;
            window_n += batch.len();
            if (step + 1) % a.log_every_steps == 0 {
                log.step(
                    epoch,
                    step,
                    window_loss / window_n as f64,
                    window_correct as f64 / window_n as f64,
                )?;
                (window_loss, window_correct, window_n) = (0.0, 0, 0);
            }
        }
        let n = (steps_per_epoch * a.batch) as f64;
        log.epoch(epoch, epoch_loss / n, epoch_correct as f64 / n)?;
        // Rewrite a sixteenth of the ballast, as an optimizer rewrites its state.
        let stride = 16 * 4096;
        for page in (epoch % 16 * 4096..ballast.len()).step_by(stride) {
            ballast[page] = ballast[page].wrapping_add(1);
        }
        if a.pause_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(a.pause_ms));
        }
        if let Some(dir) = &a.checkpoint_dir
            && SAVE_ASKED.load(std::sync::atomic::Ordering::SeqCst)
            && epoch + 1 < a.epochs
        {
            save(
                dir,
                &Checkpoint {
                    epoch: epoch + 1,
                    rng: rng.0,
                    order,
                    w1: bits(&model.w1),
                    b1: bits(&model.b1),
                    w2: bits(&model.w2),
                    b2: model.b2.to_bits(),
                },
                &ballast,
            )?;
            println!(
                "demo-trainer: saved after epoch {epoch} to {}; exiting",
                dir.display()
            );
            return Ok(());
        }
    }
    println!(
        "demo-trainer: {} epochs in {:.1} s",
        a.epochs,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
