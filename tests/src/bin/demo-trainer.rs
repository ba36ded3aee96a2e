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
}

fn usage() -> ! {
    eprintln!(
        "usage: demo-trainer --log PATH [--format keras-csv|lightning-csv|hf-console|pytorch-print] \
         [--epochs N] [--samples N] [--features N] [--hidden N] [--batch N] [--lr X] [--seed N] [--threads N] [--log-every-steps N]"
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
    fn open(
        path: &PathBuf,
        format: &str,
        epochs: usize,
        steps_per_epoch: usize,
    ) -> std::io::Result<ProgressLog> {
        let mut out = BufWriter::new(File::create(path)?);
        match format {
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

fn main() -> std::io::Result<()> {
    let a = parse_args();
    let data = Dataset::synthetic(a.samples, a.features, a.seed);
    let mut rng = Rng(a.seed);
    let mut model = Mlp::random(a.features, a.hidden, 1.0, &mut rng);
    let steps_per_epoch = a.samples / a.batch;
    let mut log = ProgressLog::open(&a.log, &a.format, a.epochs, steps_per_epoch)?;
    let mut order: Vec<usize> = (0..a.samples).collect();
    let started = Instant::now();
    for epoch in 0..a.epochs {
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
    }
    println!(
        "demo-trainer: {} epochs in {:.1} s",
        a.epochs,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
