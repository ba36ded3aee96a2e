//! TensorBoard event files (`events.out.tfevents.*`): [`tfrecord`](crate::tfrecord) framing
//! around `tensorflow.Event` protocol messages.
//!
//! **Decoding.** The messages are declared here with prost's derive macros (prost is already in
//! the tree for the daemon's gRPC), holding only the fields read: the event's `step`, and each
//! summary value's `tag`, `metadata.plugin_data.plugin_name` and value. Unknown fields and the
//! other `Event` kinds (graphs, run metadata, histograms, images) are skipped by prost without
//! being copied. No `.proto` file, `protoc` or build script is involved: the field numbers below
//! are those of TensorFlow's `event.proto`, `summary.proto` and `tensor.proto` (stable since
//! 2016: they are an on-disk format).
//!
//! **Scalars** come in two shapes:
//! - `simple_value` (a float): PyTorch's `SummaryWriter`, tensorboardX, TF1 `tf.summary`;
//! - a rank-0 tensor (`float`, `double`, `half`, `bfloat16`; in `tensor_content` or in the typed
//!   `*_val` fields) whose tag the scalars plug-in owns: TF2 `tf.summary.scalar`, Keras'
//!   `TensorBoard` callback. The plug-in is named in the metadata of the tag's *first* value
//!   only, so the decoder remembers each tag's plug-in for the rest of the file; a one-element
//!   float tensor of a tag whose plug-in was never named is taken as a scalar too, one owned by
//!   another plug-in (histograms, images, text, hparams) never.
//!
//! **Records.** Each event with at least one scalar is one record: `step` is the event's step,
//! the metrics are its scalars by tag. A tag named `epoch` (or `<prefix>/epoch`: Hugging Face's
//! `train/epoch`) is the record's epoch rather than a metric. The split is `eval` when the file
//! lies in a directory named for held-out data (`validation/`, `val/`, `eval/`, `test/`: Keras
//! writes `train/` and `validation/` side by side) or when every tag is named so (`val_loss`,
//! `eval/loss`, `Loss/val`); the tags of such a directory are named `<directory>/<tag>`
//! (`validation/epoch_loss`), as TensorBoard shows them, so that they neither collide with the
//! training run's tags nor read as training values.
//!
//! Bad input never stops the file: a record whose checksum fails is skipped and counted (the
//! caller warns once), an undecodable event is skipped and counted, a torn tail waits.

use std::collections::HashMap;
use std::path::Path;

use prost::Message;

use crate::parsers::{Names, split_by_names};
use crate::record::{Metrics, RecordData, Split};
use crate::tfrecord::{FramingErrors, RecordReader};

/// The `Event` message (`tensorflow/core/util/event.proto`), fields read only.
#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "event::What", tags = "3, 5")]
    pub what: Option<event::What>,
}

/// `Event.what`, the kinds read.
pub mod event {
    /// What an event holds (graphs, run metadata and session logs are skipped).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum What {
        #[prost(string, tag = "3")]
        FileVersion(String),
        #[prost(message, tag = "5")]
        Summary(super::Summary),
    }
}

/// `Summary` (`tensorflow/core/framework/summary.proto`).
#[derive(Clone, PartialEq, Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `Summary.Value`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(message, optional, tag = "9")]
    pub metadata: Option<SummaryMetadata>,
    #[prost(oneof = "summary_value::Value", tags = "2, 8")]
    pub value: Option<summary_value::Value>,
}

/// `Summary.Value.value`, the kinds read.
pub mod summary_value {
    /// A scalar's two encodings (images, audio and histograms are skipped).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(float, tag = "2")]
        SimpleValue(f32),
        #[prost(message, tag = "8")]
        Tensor(super::TensorProto),
    }
}

/// `SummaryMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    pub plugin_data: Option<PluginData>,
}

/// `SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, Message)]
pub struct PluginData {
    #[prost(string, tag = "1")]
    pub plugin_name: String,
}

/// `TensorProto` (`tensorflow/core/framework/tensor.proto`), the fields a scalar uses.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(message, optional, tag = "2")]
    pub tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", tag = "4")]
    pub tensor_content: Vec<u8>,
    #[prost(float, repeated, tag = "5")]
    pub float_val: Vec<f32>,
    #[prost(double, repeated, tag = "6")]
    pub double_val: Vec<f64>,
    #[prost(int32, repeated, tag = "13")]
    pub half_val: Vec<i32>,
}

/// `TensorShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShape {
    #[prost(message, repeated, tag = "2")]
    pub dim: Vec<TensorDim>,
}

/// `TensorShapeProto.Dim`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorDim {
    #[prost(int64, tag = "1")]
    pub size: i64,
}

// `DataType` values (`types.proto`).
const DT_FLOAT: i32 = 1;
const DT_DOUBLE: i32 = 2;
const DT_BFLOAT16: i32 = 14;
const DT_HALF: i32 = 19;

/// The value of a tensor holding one float, if it is one.
fn tensor_scalar(t: &TensorProto) -> Option<f64> {
    let elements: i64 = t
        .tensor_shape
        .as_ref()
        .map_or(1, |s| s.dim.iter().map(|d| d.size).product());
    if elements != 1 {
        return None;
    }
    let c = &t.tensor_content;
    match t.dtype {
        DT_FLOAT if c.len() == 4 => Some(f64::from(f32::from_le_bytes(c[..4].try_into().ok()?))),
        DT_FLOAT => t.float_val.first().map(|v| f64::from(*v)),
        DT_DOUBLE if c.len() == 8 => Some(f64::from_le_bytes(c[..8].try_into().ok()?)),
        DT_DOUBLE => t.double_val.first().copied(),
        DT_HALF | DT_BFLOAT16 => {
            let bits = if c.len() == 2 {
                u16::from_le_bytes([c[0], c[1]])
            } else {
                u16::try_from(*t.half_val.first()? & 0xffff).ok()?
            };
            Some(if t.dtype == DT_HALF {
                half_to_f64(bits)
            } else {
                f64::from(f32::from_bits(u32::from(bits) << 16))
            })
        }
        _ => None,
    }
}

/// IEEE 754 binary16 to f64.
fn half_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Directory names that hold held-out runs (Keras' `validation/`).
fn is_eval_dir(name: &str) -> bool {
    matches!(Split::from_word(name), Some(Split::Eval))
}

/// Incremental decoder of one event file.
#[derive(Debug)]
pub struct EventsDecoder {
    reader: RecordReader,
    names: Names,
    /// `validation/` when the file lies in a held-out run's directory.
    prefix: Option<String>,
    /// Which tags the scalars plug-in owns (`false`: another plug-in does).
    plugins: HashMap<String, bool>,
    /// Events decoded (of any kind).
    events: u64,
    /// Records whose framing held but whose event did not decode.
    undecodable: u64,
    scratch: Vec<Vec<u8>>,
}

impl EventsDecoder {
    /// A decoder for the event file at `path` (its directory names held-out runs).
    pub fn new(path: &Path) -> Self {
        let prefix = path
            .parent()
            .and_then(|d| d.file_name())
            .and_then(|d| d.to_str())
            .filter(|d| is_eval_dir(d))
            .map(|d| format!("{d}/"));
        EventsDecoder {
            reader: RecordReader::new(),
            names: Names::default(),
            prefix,
            plugins: HashMap::new(),
            events: 0,
            undecodable: 0,
            scratch: Vec::new(),
        }
    }

    /// Feeds appended bytes; records completed by them are appended to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<RecordData>) {
        let mut scratch = std::mem::take(&mut self.scratch);
        // Decoding borrows `self`: complete records are copied out first (they are small).
        self.reader.push(bytes, |data| scratch.push(data.to_vec()));
        for data in scratch.drain(..) {
            self.event(&data, out);
        }
        self.scratch = scratch;
    }

    /// The file was truncated or replaced.
    pub fn reset(&mut self) {
        self.reader.reset();
        self.plugins.clear();
    }

    /// True once a well-formed event was read (the file is an event file).
    pub fn recognized(&self) -> bool {
        self.events > 0
    }

    /// Framing problems so far.
    pub fn framing_errors(&self) -> FramingErrors {
        self.reader.errors()
    }

    /// Events whose checksum held but that did not decode.
    pub fn undecodable(&self) -> u64 {
        self.undecodable
    }

    /// Bytes of an incomplete record held back.
    pub fn pending_bytes(&self) -> usize {
        self.reader.pending_bytes()
    }

    fn event(&mut self, data: &[u8], out: &mut Vec<RecordData>) {
        let ev = match Event::decode(data) {
            Ok(ev) => ev,
            Err(_) => {
                self.undecodable += 1;
                return;
            }
        };
        self.events += 1;
        let Some(event::What::Summary(summary)) = ev.what else {
            return;
        };
        let mut metrics = Metrics::new();
        let mut epoch = None;
        for v in summary.value {
            let plugin = v
                .metadata
                .and_then(|m| m.plugin_data)
                .map(|p| p.plugin_name);
            if let Some(p) = plugin {
                let scalar = p == "scalars";
                self.plugins.insert(v.tag.clone(), scalar);
            }
            let value = match v.value {
                Some(summary_value::Value::SimpleValue(x)) => f64::from(x),
                Some(summary_value::Value::Tensor(t)) => {
                    if self.plugins.get(&v.tag) == Some(&false) {
                        continue;
                    }
                    match tensor_scalar(&t) {
                        Some(x) => x,
                        None => continue,
                    }
                }
                None => continue,
            };
            if v.tag == "epoch" || v.tag.ends_with("/epoch") {
                epoch = Some(value);
                continue;
            }
            let name = match &self.prefix {
                Some(p) if !v.tag.starts_with(p.as_str()) => {
                    self.names.get(&format!("{p}{}", v.tag))
                }
                _ => self.names.get(&v.tag),
            };
            metrics.insert(name, value);
        }
        if metrics.is_empty() && epoch.is_none() {
            return;
        }
        let split = if self.prefix.is_some() {
            Split::Eval
        } else {
            split_by_names(&metrics)
        };
        out.push(RecordData {
            epoch,
            step: u64::try_from(ev.step).ok(),
            split,
            metrics,
        });
    }
}

/// Encodes one event of scalars as TensorBoard writes it (`simple_value`, as PyTorch does):
/// the test and benchmark writers' helper.
pub fn scalar_event(wall_time: f64, step: i64, scalars: &[(&str, f32)]) -> Vec<u8> {
    Event {
        wall_time,
        step,
        what: Some(event::What::Summary(Summary {
            value: scalars
                .iter()
                .map(|(tag, v)| SummaryValue {
                    tag: (*tag).to_owned(),
                    metadata: None,
                    value: Some(summary_value::Value::SimpleValue(*v)),
                })
                .collect(),
        })),
    }
    .encode_to_vec()
}

/// The first event of every file: `file_version: "brain.Event:2"`.
pub fn file_version_event(wall_time: f64) -> Vec<u8> {
    Event {
        wall_time,
        step: 0,
        what: Some(event::What::FileVersion("brain.Event:2".into())),
    }
    .encode_to_vec()
}

/// True when `name` is a TensorBoard event file's name.
pub fn is_event_file_name(name: &str) -> bool {
    name.contains("tfevents")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tfrecord::frame;

    fn file(events: &[Vec<u8>]) -> Vec<u8> {
        let mut out = frame(&file_version_event(1.0));
        for e in events {
            out.extend(frame(e));
        }
        out
    }

    fn tensor_event(step: i64, tag: &str, x: f32, with_metadata: bool, content: bool) -> Vec<u8> {
        let tensor = TensorProto {
            dtype: DT_FLOAT,
            tensor_shape: Some(TensorShape { dim: vec![] }),
            tensor_content: if content {
                x.to_le_bytes().to_vec()
            } else {
                vec![]
            },
            float_val: if content { vec![] } else { vec![x] },
            double_val: vec![],
            half_val: vec![],
        };
        Event {
            wall_time: 2.0,
            step,
            what: Some(event::What::Summary(Summary {
                value: vec![SummaryValue {
                    tag: tag.into(),
                    metadata: with_metadata.then(|| SummaryMetadata {
                        plugin_data: Some(PluginData {
                            plugin_name: "scalars".into(),
                        }),
                    }),
                    value: Some(summary_value::Value::Tensor(tensor)),
                }],
            })),
        }
        .encode_to_vec()
    }

    fn decode(path: &str, bytes: &[u8]) -> Vec<RecordData> {
        let mut d = EventsDecoder::new(Path::new(path));
        let mut out = Vec::new();
        d.push(bytes, &mut out);
        out
    }

    #[test]
    fn simple_values_and_scalar_tensors_become_records() {
        let bytes = file(&[
            scalar_event(1.0, 0, &[("Loss/train", 2.5)]),
            tensor_event(1, "epoch_loss", 1.5, true, true),
            tensor_event(2, "epoch_loss", 1.25, false, false),
        ]);
        let recs = decode("/x/events.out.tfevents.1.h", &bytes);
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].metrics.get("Loss/train"), Some(2.5));
        assert_eq!(recs[0].step, Some(0));
        assert_eq!(recs[1].metrics.get("epoch_loss"), Some(1.5));
        assert_eq!(
            recs[2].metrics.get("epoch_loss"),
            Some(1.25),
            "plug-in remembered"
        );
        assert!(recs.iter().all(|r| r.split == Split::Train));
    }

    #[test]
    fn validation_directories_and_eval_tags_are_eval() {
        let bytes = file(&[tensor_event(0, "epoch_loss", 0.5, true, true)]);
        let recs = decode("/logs/fit/validation/events.out.tfevents.1.h.2.v2", &bytes);
        assert_eq!(recs[0].split, Split::Eval);
        assert_eq!(recs[0].metrics.get("validation/epoch_loss"), Some(0.5));
        let recs = decode(
            "/x/events.out.tfevents.1",
            &file(&[
                scalar_event(1.0, 3, &[("eval/loss", 0.5)]),
                scalar_event(1.0, 3, &[("Loss/val", 0.5)]),
            ]),
        );
        assert!(recs.iter().all(|r| r.split == Split::Eval));
    }

    #[test]
    fn epoch_tags_are_the_records_epoch_and_other_plugins_are_skipped() {
        let mut hist = tensor_event(0, "weights", 1.0, true, true);
        // Same tensor, but the tag belongs to the histogram plug-in.
        let mut ev = Event::decode(&hist[..]).unwrap();
        if let Some(event::What::Summary(s)) = &mut ev.what {
            s.value[0].metadata = Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "histograms".into(),
                }),
            });
        }
        hist = ev.encode_to_vec();
        let recs = decode(
            "/x/events.out.tfevents.1",
            &file(&[
                hist,
                scalar_event(1.0, 7, &[("train/epoch", 0.5), ("train/loss", 1.0)]),
            ]),
        );
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0].epoch, Some(0.5));
        assert_eq!(recs[0].metrics.len(), 1);
    }

    #[test]
    fn half_precision_values() {
        assert_eq!(half_to_f64(0x3c00), 1.0);
        assert_eq!(half_to_f64(0xc000), -2.0);
        assert_eq!(half_to_f64(0x3555), 0.333251953125);
        assert!(half_to_f64(0x7e00).is_nan());
        assert_eq!(half_to_f64(0x7c00), f64::INFINITY);
    }

    #[test]
    fn garbage_that_frames_correctly_is_counted_not_fatal() {
        let mut bytes = file(&[]);
        bytes.extend(frame(&[0xff, 0xff, 0xff]));
        bytes.extend(frame(&scalar_event(1.0, 1, &[("loss", 1.0)])));
        let mut d = EventsDecoder::new(Path::new("/x/events.out.tfevents.1"));
        let mut out = Vec::new();
        d.push(&bytes, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(d.undecodable(), 1);
    }
}
