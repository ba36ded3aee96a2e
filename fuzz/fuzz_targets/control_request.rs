//! Arbitrary bytes as a control-socket request line, decoded as the daemon decodes it
//! (`governor::control::serve`: one line of at most 64 KiB, read as UTF-8, then
//! `serde_json::from_str::<Request>`): no panic; a request that decodes encodes again and decodes
//! to the same request; the checks the daemon makes on what arrives never panic either; every
//! response, the error answer to this line included, encodes and decodes back.
//!
//! `cargo +nightly fuzz run control_request` (from the repository root).
#![no_main]

use std::path::Path;
use std::str::FromStr;

use governor_progress::FormatChoice;
use governor_proto::control_socket::{JobStatus, NodeStatus, Request, Response};
use libfuzzer_sys::fuzz_target;

/// `MAX_REQUEST_BYTES` in governor/src/control.rs.
const MAX_REQUEST_BYTES: usize = 64 * 1024;

fn decode(line: &str) -> Option<Request> {
    serde_json::from_str(line).ok()
}

fn round_trip_response(r: &Response) {
    let line = serde_json::to_string(r).expect("responses always serialise");
    assert!(
        !line.contains('\n'),
        "a response must stay one line: {line}"
    );
    let back: Response = serde_json::from_str(&line).expect("a response decodes");
    assert_eq!(
        serde_json::to_string(&back).unwrap(),
        line,
        "a response changed through JSON"
    );
}

fuzz_target!(|data: &[u8]| {
    // What `read_line` on a `take(MAX_REQUEST_BYTES)` reader hands over.
    let data = &data[..data.len().min(MAX_REQUEST_BYTES)];
    let data = match data.iter().position(|&b| b == b'\n') {
        Some(i) => &data[..=i],
        None => data,
    };
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    let request = match serde_json::from_str::<Request>(line) {
        Ok(r) => r,
        Err(e) => {
            // The daemon's answer to a malformed request.
            round_trip_response(&Response::Error {
                message: format!(
                    "malformed request ({:?} at line {} column {})",
                    e.classify(),
                    e.line(),
                    e.column()
                ),
            });
            return;
        }
    };

    // The client's encoding of the request decodes to the same request (JSON numbers are
    // finite, so `PartialEq` is exact here).
    let again = serde_json::to_string(&request).expect("requests always serialise");
    assert!(
        !again.contains('\n'),
        "a request must stay one line: {again}"
    );
    assert_eq!(
        decode(&again).as_ref(),
        Some(&request),
        "request changed through JSON: {line:?} -> {again:?}"
    );

    // The checks `launched_job` makes before adopting (its cgroup check, `JobCgroup::new`, is in
    // the daemon crate and not reached from here), and the daemon's answers.
    match &request {
        Request::Adopt(job) => {
            let _ = job.logs.iter().all(|l| Path::new(l).is_absolute());
            if let Some(f) = &job.format {
                let _ = FormatChoice::from_str(f).map_err(|e| e.to_string());
            }
            round_trip_response(&Response::Ok {
                message: format!("governing {}", job.name),
            });
        }
        Request::Release { cgroup } => round_trip_response(&Response::Ok {
            message: format!("released {cgroup}"),
        }),
        Request::Status => {
            // A status answer carrying the strings the request brought.
            round_trip_response(&Response::Status(Box::new(NodeStatus {
                node: line.to_owned(),
                jobs: vec![JobStatus {
                    name: line.to_owned(),
                    signal_value: Some(line.len() as f64 / 3.0),
                    ..Default::default()
                }],
                ..Default::default()
            })));
        }
        Request::Reload => {}
        Request::JoinJob { name } => round_trip_response(&Response::Ok {
            message: format!("joined /governor.slice/jobs/{name}"),
        }),
    }
});
