//! Line formats of specific programs, each recognised by a pattern no other program prints.

use std::sync::LazyLock;

use regex::Regex;

use super::{LineParser, Names};
use crate::num::parse_number;
use crate::record::{Metrics, RecordData, Split};

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("built-in pattern compiles")
}

fn cap_u64(c: &regex::Captures<'_>, i: usize) -> Option<u64> {
    c.get(i)?.as_str().replace(',', "").parse().ok()
}

fn cap_num(c: &regex::Captures<'_>, i: usize) -> Option<f64> {
    parse_number(c.get(i)?.as_str())
}

fn record(epoch: Option<f64>, step: Option<u64>, split: Split, metrics: Metrics) -> RecordData {
    RecordData {
        epoch,
        step,
        split,
        metrics,
    }
}

/// pytorch/examples (`mnist/main.py` and its many copies):
///
/// ```text
/// Train Epoch: 1 [640/60000 (1%)]\tLoss: 1.425063
/// Test set: Average loss: 0.0494, Accuracy: 9836/10000 (98%)
/// ```
///
/// Train lines: epoch as printed (1-based), step = the sample offset within the epoch as
/// printed, metric `loss`. Test lines: an eval record with `loss` and `accuracy` (percent,
/// computed from the printed counts).
pub(crate) struct PytorchExamples {
    epoch: Option<f64>,
    names: Names,
}

static PT_TRAIN: LazyLock<Regex> = LazyLock::new(|| {
    re(r"Train Epoch:\s*(\d+)\s*\[\s*(\d+)\s*/\s*(\d+)\s*\(\s*[\d.]+%\)\]\s*Loss:\s*(\S+)")
});
static PT_TEST: LazyLock<Regex> =
    LazyLock::new(|| re(r"Test set: Average loss:\s*([^,\s]+),\s*Accuracy:\s*(\d+)\s*/\s*(\d+)"));

impl PytorchExamples {
    pub(crate) fn new() -> Self {
        PytorchExamples {
            epoch: None,
            names: Names::default(),
        }
    }
}

impl LineParser for PytorchExamples {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        if line.contains("Train Epoch") {
            let Some(c) = PT_TRAIN.captures(line) else {
                return;
            };
            let Some(loss) = cap_num(&c, 4) else { return };
            let epoch = cap_u64(&c, 1).map(|e| e as f64);
            self.epoch = epoch;
            let mut m = Metrics::with_capacity(1);
            m.push_unique(self.names.get("loss"), loss);
            out.push(record(epoch, cap_u64(&c, 2), Split::Train, m));
        } else if line.contains("Test set") {
            let Some(c) = PT_TEST.captures(line) else {
                return;
            };
            let Some(loss) = cap_num(&c, 1) else { return };
            let mut m = Metrics::with_capacity(2);
            m.push_unique(self.names.get("loss"), loss);
            if let (Some(ok), Some(n)) = (cap_u64(&c, 2), cap_u64(&c, 3))
                && n > 0
            {
                m.push_unique(self.names.get("accuracy"), 100.0 * ok as f64 / n as f64);
            }
            out.push(record(self.epoch, None, Split::Eval, m));
        }
    }
}

/// nanoGPT `train.py`:
///
/// ```text
/// step 100: train loss 3.4633, val loss 3.4987
/// iter 100: loss 3.4880, time 105.35ms, mfu 0.01%
/// ```
///
/// `iter` lines are train records (step, `loss`, `time_ms`, `mfu` in percent; the first `mfu`
/// is nanoGPT's -100 sentinel and is kept as printed). `step` lines are its periodic
/// evaluation: eval records with `train_loss` and `val_loss`.
pub(crate) struct Nanogpt {
    names: Names,
}

static NANO_ITER: LazyLock<Regex> = LazyLock::new(|| {
    re(r"^\s*iter (\d+): loss ([^,\s]+)(?:, time ([-\d.]+)ms)?(?:, mfu ([-\d.]+)%)?")
});
static NANO_STEP: LazyLock<Regex> =
    LazyLock::new(|| re(r"^\s*step (\d+): train loss ([^,\s]+), val loss (\S+)"));

impl Nanogpt {
    pub(crate) fn new() -> Self {
        Nanogpt {
            names: Names::default(),
        }
    }
}

impl LineParser for Nanogpt {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let t = line.trim_start();
        if t.starts_with("iter ") {
            let Some(c) = NANO_ITER.captures(t) else {
                return;
            };
            let Some(loss) = cap_num(&c, 2) else { return };
            let mut m = Metrics::with_capacity(3);
            m.push_unique(self.names.get("loss"), loss);
            if let Some(v) = cap_num(&c, 3) {
                m.push_unique(self.names.get("time_ms"), v);
            }
            if let Some(v) = cap_num(&c, 4) {
                m.push_unique(self.names.get("mfu"), v);
            }
            out.push(record(None, cap_u64(&c, 1), Split::Train, m));
        } else if t.starts_with("step ") {
            let Some(c) = NANO_STEP.captures(t) else {
                return;
            };
            let (Some(tl), Some(vl)) = (cap_num(&c, 2), cap_num(&c, 3)) else {
                return;
            };
            let mut m = Metrics::with_capacity(2);
            m.push_unique(self.names.get("train_loss"), tl);
            m.push_unique(self.names.get("val_loss"), vl);
            out.push(record(None, cap_u64(&c, 1), Split::Eval, m));
        }
    }
}

/// Caffe's solver, through glog:
///
/// ```text
/// I0728 23:56:00.280272  4259 solver.cpp:218] Iteration 100 (4.71409 iter/s, 21.213s/100 iters), loss = 0.224371
/// I0728 23:56:10.000000  4259 solver.cpp:330] Iteration 500, Testing net (#0)
/// I0728 23:56:11.000000  4259 solver.cpp:397]     Test net output #0: accuracy = 0.9846
/// I0728 23:56:11.000000  4259 solver.cpp:397]     Test net output #1: loss = 0.0475 (* 1 = 0.0475 loss)
/// ```
///
/// `Iteration N ..., loss = X` is a train record (step N, `loss` = the solver's smoothed
/// loss). The `Test net output` lines of one test pass form one eval record (step = the
/// iteration tested), emitted at the next other line or at the end of the input.
/// `Train net output` and `lr` lines repeat what the iteration line says and are skipped.
pub(crate) struct Caffe {
    names: Names,
    pending: Option<RecordData>,
    test_iteration: Option<u64>,
}

static GLOG_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| re(r"^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+\s+[^\]\s]+\]\s?(.*)$"));
static CAFFE_ITER: LazyLock<Regex> =
    LazyLock::new(|| re(r"^\s*Iteration (\d+)(?: \([^)]*\))?, loss = (\S+)"));
static CAFFE_TESTING: LazyLock<Regex> =
    LazyLock::new(|| re(r"^\s*Iteration (\d+), Testing net \(#\d+\)"));
static CAFFE_TEST_OUT: LazyLock<Regex> =
    LazyLock::new(|| re(r"^\s*Test net output #\d+: (\S+) = (\S+)"));

impl Caffe {
    pub(crate) fn new() -> Self {
        Caffe {
            names: Names::default(),
            pending: None,
            test_iteration: None,
        }
    }

    fn emit_pending(&mut self, out: &mut Vec<RecordData>) {
        if let Some(p) = self.pending.take()
            && !p.metrics.is_empty()
        {
            out.push(p);
        }
    }
}

impl LineParser for Caffe {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        let body = match GLOG_PREFIX.captures(line) {
            Some(c) => c.get(1).map_or("", |m| m.as_str()),
            None => line,
        };
        if body.contains("Test net output") {
            if let Some(c) = CAFFE_TEST_OUT.captures(body)
                && let Some(v) = cap_num(&c, 2)
            {
                let name = self.names.get(&c[1]);
                let step = self.test_iteration;
                self.pending
                    .get_or_insert_with(|| record(None, step, Split::Eval, Metrics::new()))
                    .metrics
                    .insert(name, v);
            }
            return;
        }
        self.emit_pending(out);
        if !body.contains("Iteration ") {
            return;
        }
        if let Some(c) = CAFFE_TESTING.captures(body) {
            self.test_iteration = cap_u64(&c, 1);
            return;
        }
        if let Some(c) = CAFFE_ITER.captures(body)
            && let Some(loss) = cap_num(&c, 2)
        {
            let mut m = Metrics::with_capacity(1);
            m.push_unique(self.names.get("loss"), loss);
            out.push(record(None, cap_u64(&c, 1), Split::Train, m));
        }
    }

    fn flush(&mut self, out: &mut Vec<RecordData>) {
        self.emit_pending(out);
    }
}

/// BasicSR / pyiqa / Real-ESRGAN `MessageLogger`:
///
/// ```text
/// 2025-02-04 22:37:09,911 INFO: [basel..][epoch:  0, iter:     100, lr:(3.000e-05,)] [eta: 4:06:17, time (data): 1.663 (0.247)] l_mos: 8.1951e-03 l_metric: 1.5984e-01
/// 2025-02-04 22:40:00,000 INFO: Validation Set5
///          # psnr: 30.1234    Best: 30.1234 @ 5000 iter
/// ```
///
/// Train lines: epoch, step = `iter` (thousands separators removed), metrics `lr` (first
/// group), `time`, `data_time` and every `name: value` pair after the brackets (losses are
/// `l_*`). Validation lines (`# metric: value`) are eval records at the latest train
/// epoch/step, recognised only once a train line has been seen.
pub(crate) struct Basicsr {
    names: Names,
    epoch: Option<f64>,
    step: Option<u64>,
    seen_train: bool,
}

static BASICSR_HEAD: LazyLock<Regex> =
    LazyLock::new(|| re(r"\[epoch:\s*(\d+), iter:\s*([\d,]+), lr:\(([^)]*)\)\]"));
static BASICSR_TIME: LazyLock<Regex> =
    LazyLock::new(|| re(r"time \(data\):\s*(\S+)\s*\((\S+)\)\]"));
static BASICSR_VAL: LazyLock<Regex> = LazyLock::new(|| re(r"^\s*# ([^:\s]+): (\S+)"));

impl Basicsr {
    pub(crate) fn new() -> Self {
        Basicsr {
            names: Names::default(),
            epoch: None,
            step: None,
            seen_train: false,
        }
    }
}

impl LineParser for Basicsr {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        if line.contains("[epoch:") {
            let Some(c) = BASICSR_HEAD.captures(line) else {
                return;
            };
            let mut m = Metrics::with_capacity(8);
            if let Some(lr) = c[3].split(',').next().and_then(parse_number) {
                m.push_unique(self.names.get("lr"), lr);
            }
            let head_end = c.get(0).map_or(0, |g| g.end());
            let mut rest = &line[head_end..];
            if let Some(t) = BASICSR_TIME.captures(rest) {
                if let Some(v) = cap_num(&t, 1) {
                    m.insert(self.names.get("time"), v);
                }
                if let Some(v) = cap_num(&t, 2) {
                    m.insert(self.names.get("data_time"), v);
                }
                rest = &rest[t.get(0).map_or(0, |g| g.end())..];
            }
            let mut tokens = rest.split_whitespace().peekable();
            while let Some(tok) = tokens.next() {
                if let Some(key) = tok.strip_suffix(':')
                    && !key.is_empty()
                    && let Some(v) = tokens.peek().and_then(|v| parse_number(v))
                {
                    m.insert(self.names.get(key), v);
                    tokens.next();
                }
            }
            let epoch = cap_u64(&c, 1).map(|e| e as f64);
            let step = cap_u64(&c, 2);
            self.epoch = epoch;
            self.step = step;
            self.seen_train = true;
            out.push(record(epoch, step, Split::Train, m));
        } else if self.seen_train
            && line.contains("# ")
            && let Some(c) = BASICSR_VAL.captures(line)
            && let Some(v) = cap_num(&c, 2)
        {
            let mut m = Metrics::with_capacity(1);
            m.push_unique(self.names.get(&c[1]), v);
            out.push(record(self.epoch, self.step, Split::Eval, m));
        }
    }
}

/// tqdm bars with a numeric postfix, e.g. PyTorch Lightning's progress bar or a loop's
/// `set_postfix(loss=...)`:
///
/// ```text
/// Epoch 3:  45%|████▌     | 450/1000 [00:30<00:36, 15.0it/s, loss=0.234, v_num=0]
/// ```
///
/// Each bar state with at least one numeric `key=value` is a record: step = the bar's counter,
/// epoch = the number after `epoch` in the description, if any; eval when the description
/// names validation/test. `v_num` (Lightning's version) is not a metric.
pub(crate) struct Tqdm {
    names: Names,
}

static TQDM_BAR: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?:^|[\s|])(\d+)/(?:\d+|\?)\s*\[([^\[\]]*?(?:it/s|s/it|/s\b)[^\[\]]*)\]")
});
static TQDM_EPOCH: LazyLock<Regex> = LazyLock::new(|| re(r"(?i)epoch\s*[:#]?\s*(\d+)"));

impl Tqdm {
    pub(crate) fn new() -> Self {
        Tqdm {
            names: Names::default(),
        }
    }
}

impl LineParser for Tqdm {
    fn line(&mut self, line: &str, out: &mut Vec<RecordData>) {
        if !line.contains('=') || !line.contains('[') {
            return;
        }
        let Some(c) = TQDM_BAR.captures(line) else {
            return;
        };
        let inner = &c[2];
        let mut m = Metrics::with_capacity(4);
        for part in inner.split(',') {
            let Some((k, v)) = part.split_once('=') else {
                continue;
            };
            let k = k.trim();
            if k.is_empty() || k == "v_num" || k.contains(char::is_whitespace) {
                continue;
            }
            if let Some(v) = parse_number(v) {
                m.insert(self.names.get(k), v);
            }
        }
        if m.is_empty() {
            return;
        }
        let desc = &line[..c.get(0).map_or(0, |g| g.start())];
        let epoch = TQDM_EPOCH
            .captures(desc)
            .and_then(|e| cap_u64(&e, 1))
            .map(|e| e as f64);
        let lower = desc.to_ascii_lowercase();
        let split = if lower.contains("val") || lower.contains("eval") || lower.contains("test") {
            Split::Eval
        } else {
            Split::Train
        };
        out.push(record(epoch, cap_u64(&c, 1), split, m));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(p: &mut dyn LineParser, text: &str) -> Vec<RecordData> {
        let mut out = Vec::new();
        for l in text.lines() {
            p.line(l, &mut out);
        }
        p.flush(&mut out);
        out
    }

    #[test]
    fn pytorch_examples_train_and_test() {
        let recs = feed(
            &mut PytorchExamples::new(),
            "Train Epoch: 1 [640/60000 (1%)]\tLoss: 1.425063\n\
             Train Epoch: 1 [1280/60000 (2%)]        Loss: nan\n\
             Test set: Average loss: 0.0494, Accuracy: 9836/10000 (98%)\n",
        );
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].step, Some(640));
        assert_eq!(recs[0].epoch, Some(1.0));
        assert!(recs[1].metrics.get("loss").unwrap().is_nan());
        assert_eq!(recs[2].split, Split::Eval);
        assert!((recs[2].metrics.get("accuracy").unwrap() - 98.36).abs() < 1e-9);
    }

    #[test]
    fn nanogpt_iter_and_eval_lines() {
        let recs = feed(
            &mut Nanogpt::new(),
            "step 0: train loss 4.2367, val loss 4.2475\n\
             iter 0: loss 4.2709, time 10268.08ms, mfu -100.00%\n\
             iter 440: loss nan, time 1439.46ms, mfu 0.01%\n\
             saving checkpoint to out\n",
        );
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].split, Split::Eval);
        assert_eq!(recs[0].metrics.get("val_loss"), Some(4.2475));
        assert_eq!(recs[1].metrics.get("mfu"), Some(-100.0));
        assert_eq!(recs[2].step, Some(440));
        assert!(recs[2].metrics.get("loss").unwrap().is_nan());
    }

    #[test]
    fn caffe_iterations_and_grouped_test_outputs() {
        let recs = feed(
            &mut Caffe::new(),
            "I0728 23:55:39.066728  4259 solver.cpp:218] Iteration 0 (-1.02432e-37 iter/s, 0.199s/100 iters), loss = 2.40473\n\
             I0728 23:55:39.066808  4259 solver.cpp:237]     Train net output #0: loss = 2.40473 (* 1 = 2.40473 loss)\n\
             I0728 23:56:10.000000  4259 solver.cpp:330] Iteration 500, Testing net (#0)\n\
             I0728 23:56:11.000000  4259 solver.cpp:397]     Test net output #0: accuracy = 0.9846\n\
             I0728 23:56:11.000000  4259 solver.cpp:397]     Test net output #1: loss = 0.0475 (* 1 = 0.0475 loss)\n\
             I0728 23:56:12.000000  4259 solver.cpp:218] Iteration 500 (4.7 iter/s, 21.2s/100 iters), loss = 0.05\n\
             I0728 23:56:13.000000  4259 solver.cpp:330] Iteration 1000, Testing net (#0)\n\
             I0728 23:56:14.000000  4259 solver.cpp:397]     Test net output #0: accuracy = 0.99\n",
        );
        assert_eq!(recs.len(), 4, "{recs:?}");
        assert_eq!(recs[0].metrics.get("loss"), Some(2.40473));
        assert_eq!(recs[1].split, Split::Eval);
        assert_eq!(recs[1].step, Some(500));
        assert_eq!(recs[1].metrics.get("accuracy"), Some(0.9846));
        assert_eq!(recs[1].metrics.get("loss"), Some(0.0475));
        assert_eq!(recs[2].step, Some(500));
        assert_eq!(recs[3].step, Some(1000));
    }

    #[test]
    fn basicsr_train_and_validation() {
        let recs = feed(
            &mut Basicsr::new(),
            "  # psnr: 1.0\n\
             2025-02-04 22:37:09,911 INFO: [basel..][epoch:  0, iter:   1,100, lr:(3.000e-05,)] [eta: 4:06:17, time (data): 1.663 (0.247)] l_mos: 8.1951e-03 train_metrics/srcc: 8.9118e-01 \n\
             2025-02-04 22:40:00,000 INFO: Validation Set5\n\
             \t # psnr: 30.1234\tBest: 30.1234 @ 5000 iter\n",
        );
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].step, Some(1100));
        assert_eq!(recs[0].metrics.get("lr"), Some(3e-5));
        assert_eq!(recs[0].metrics.get("time"), Some(1.663));
        assert_eq!(recs[0].metrics.get("data_time"), Some(0.247));
        assert_eq!(recs[0].metrics.get("l_mos"), Some(8.1951e-03));
        assert_eq!(recs[0].metrics.get("train_metrics/srcc"), Some(8.9118e-01));
        assert_eq!(recs[1].split, Split::Eval);
        assert_eq!(recs[1].metrics.get("psnr"), Some(30.1234));
        assert_eq!(recs[1].step, Some(1100));
    }

    #[test]
    fn tqdm_postfix() {
        let recs = feed(
            &mut Tqdm::new(),
            "Epoch 3:  45%|████▌     | 450/1000 [00:30<00:36, 15.0it/s, loss=0.234, v_num=0]\n\
             Validation DataLoader 0:  50%|█████     | 5/10 [00:01<00:01,  4.1it/s, val_acc=91.2%]\n\
             Loading weights: 100% 284/284 [00:00<00:00, 1161.23it/s, Materializing param=shared.weight]\n\
              17% 34/204 [01:03<05:30,  1.94s/it]\n",
        );
        assert_eq!(recs.len(), 2, "{recs:?}");
        assert_eq!(recs[0].epoch, Some(3.0));
        assert_eq!(recs[0].step, Some(450));
        assert_eq!(recs[0].metrics.get("loss"), Some(0.234));
        assert!(!recs[0].metrics.contains("v_num"));
        assert_eq!(recs[1].split, Split::Eval);
        assert_eq!(recs[1].metrics.get("val_acc"), Some(91.2));
    }
}
