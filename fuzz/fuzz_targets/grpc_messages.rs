//! Arbitrary bytes as each gRPC message that crosses a trust boundary (`prost::Message::decode`),
//! then its hand-written `TryFrom`/`From` into the domain type: no panic, errors are fine; a
//! message that converts converts back (`From<domain> for pb::...`) and again to the same
//! domain value.
//!
//! The first byte picks the message: what the coordinator receives from nodes (`NodeMessage`)
//! and from govctl (`JobSpec` in `SubmitJobRequest`), what a node receives from the coordinator
//! (`CoordinatorMessage`), and what govctl receives (`NodeSummary`, `JobSummary`, `JobDetail`,
//! `PolicyResponse`, `StatsResponse`).
//!
//! `cargo +nightly fuzz run grpc_messages` (from the repository root).
#![no_main]

use std::fmt::Debug;

use governor_proto::control::{JobDetail, JobSpec, JobSummary, NodeSummary, PolicyState, Stats};
use governor_proto::node::{CoordinatorMessage, NodeMessage};
use governor_proto::{InvalidMessage, pb};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// `Debug` text with negative zeros written as zeros: proto3 leaves a float equal to its
/// default (0.0, which -0.0 equals) off the wire, so -0.0 arrives as 0.0, the same number.
fn same_numbers(debug: String) -> String {
    let mut out = String::with_capacity(debug.len());
    let mut rest = debug.as_str();
    while let Some(i) = rest.find("-0.0") {
        let after = &rest[i + 4..];
        out.push_str(&rest[..i]);
        if after.starts_with(|c: char| c.is_ascii_digit() || c == 'e') {
            out.push_str("-0.0");
        } else {
            out.push_str("0.0");
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// Convert `message`, and check that the domain value survives the way back. Values are compared
/// by their `Debug` text: NaN is a value the wire may carry.
fn check<M, D>(message: M)
where
    M: Message + Default,
    D: TryFrom<M, Error = InvalidMessage> + Into<M> + Clone + Debug,
{
    let Ok(domain) = D::try_from(message) else {
        return;
    };
    let wire: M = domain.clone().into();
    // What the sender puts on the wire decodes to what it built.
    let wire = M::decode(wire.encode_to_vec().as_slice()).expect("an encoded message decodes");
    match D::try_from(wire) {
        Ok(again) => assert_eq!(
            same_numbers(format!("{again:?}")),
            same_numbers(format!("{domain:?}")),
            "changed through the wire"
        ),
        Err(e) => panic!("{domain:?} does not convert back: {e}"),
    }
}

/// The same for the conversions that cannot fail.
fn check_infallible<M, D>(message: M)
where
    M: Message + Default,
    D: From<M> + Into<M> + Clone + Debug,
{
    let domain = D::from(message);
    let wire: M = domain.clone().into();
    let again = D::from(M::decode(wire.encode_to_vec().as_slice()).unwrap());
    assert_eq!(
        same_numbers(format!("{again:?}")),
        same_numbers(format!("{domain:?}")),
        "changed through the wire"
    );
}

/// Run `f` on `bytes` decoded as `M`, if they decode.
fn decode<M: Message + Default>(bytes: &[u8], f: impl FnOnce(M)) {
    if let Ok(m) = M::decode(bytes) {
        f(m);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    match which % 8 {
        0 => decode(bytes, check::<pb::NodeMessage, NodeMessage>),
        1 => decode(bytes, check::<pb::CoordinatorMessage, CoordinatorMessage>),
        // The coordinator's SubmitJob: the spec inside the request.
        2 => decode(bytes, |r: pb::SubmitJobRequest| {
            r.spec.into_iter().for_each(check::<pb::JobSpec, JobSpec>);
        }),
        3 => decode(bytes, |r: pb::ListNodesResponse| {
            r.nodes
                .into_iter()
                .for_each(check::<pb::NodeSummary, NodeSummary>);
        }),
        4 => decode(bytes, |r: pb::ListJobsResponse| {
            r.jobs
                .into_iter()
                .for_each(check::<pb::JobSummary, JobSummary>);
        }),
        5 => decode(bytes, |r: pb::GetJobResponse| {
            r.job
                .into_iter()
                .for_each(check::<pb::JobDetail, JobDetail>);
        }),
        6 => decode(bytes, check_infallible::<pb::PolicyResponse, PolicyState>),
        _ => decode(bytes, check_infallible::<pb::StatsResponse, Stats>),
    }
});
