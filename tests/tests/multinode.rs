//! Multi-node scenarios: `cargo xtask vm-test --nodes N` boots N guests on one L2 segment
//! (10.10.0.1 .. 10.10.0.N) and runs the ignored tests of this file in every guest, with
//! GOVERNOR_NODE (1-based index) and GOVERNOR_NODES set. Each test branches on its node index.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use governor_integration_tests::require_vm;

fn node_env() -> (u32, u32) {
    let get = |k: &str| -> u32 {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} is not set: run with `cargo xtask vm-test --nodes N`"))
    };
    (get("GOVERNOR_NODE"), get("GOVERNOR_NODES"))
}

/// Every node serves on 10.10.0.N:7000 and exchanges a message with every other node over the
/// shared segment; the application-level ack makes the exchange reliable.
#[test]
#[ignore = "vm: needs the multi-node bed; run with `cargo xtask vm-test --nodes 3`"]
fn multinode_every_node_reaches_every_other() {
    require_vm();
    let (me, n) = node_env();
    let peers: Vec<u32> = (1..=n).filter(|&m| m != me).collect();
    let listener = TcpListener::bind("0.0.0.0:7000").expect("bind :7000");
    let expected = peers.len();
    let server = thread::spawn(move || {
        let mut served = 0;
        while served < expected {
            let (mut s, addr) = listener.accept().expect("accept");
            let mut buf = [0u8; 64];
            let len = s.read(&mut buf).unwrap_or(0);
            let msg = String::from_utf8_lossy(&buf[..len]).to_string();
            let _ = s.write_all(format!("ack from node{me} to {msg}").as_bytes());
            eprintln!("node{me}: served {addr}: {msg}");
            served += 1;
        }
    });
    for m in peers {
        let deadline = Instant::now() + Duration::from_secs(120);
        let reply = loop {
            let attempt = (|| -> std::io::Result<String> {
                let mut s = TcpStream::connect_timeout(
                    &format!("10.10.0.{m}:7000").parse().unwrap(),
                    Duration::from_secs(3),
                )?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                s.write_all(format!("hello from node{me}").as_bytes())?;
                let mut r = String::new();
                s.read_to_string(&mut r)?;
                if r.is_empty() {
                    return Err(std::io::Error::other("empty reply"));
                }
                Ok(r)
            })();
            match attempt {
                Ok(r) => break r,
                Err(e) if Instant::now() < deadline => {
                    eprintln!("node{me} -> node{m}: {e}, retrying");
                    thread::sleep(Duration::from_millis(500));
                }
                Err(e) => {
                    panic!("node{me} could not reach node{m} at 10.10.0.{m}:7000 in 120 s: {e}")
                }
            }
        };
        eprintln!("node{me} -> node{m}: {reply}");
        assert!(reply.starts_with(&format!("ack from node{m}")));
    }
    server.join().expect("server thread panicked");
}
