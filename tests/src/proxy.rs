//! A TCP relay on loopback that a test can cut, as a network partition between one node and
//! the coordinator: cut, it closes every connection it relays and closes each new one at once;
//! healed, it relays again. Both directions at once: a cut node neither hears nor is heard.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A running relay to one address; it stops relaying when dropped.
pub struct CutProxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl CutProxy {
    /// Listen on a free loopback port and relay every connection to `target`.
    pub fn start(target: SocketAddr) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the relay");
        let addr = listener.local_addr().unwrap();
        let proxy = CutProxy {
            addr,
            cut: Arc::default(),
            open: Arc::default(),
            stop: Arc::default(),
        };
        let (cut, open, stop) = (proxy.cut.clone(), proxy.open.clone(), proxy.stop.clone());
        thread::spawn(move || {
            for inbound in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(inbound) = inbound else { continue };
                if cut.load(Ordering::SeqCst) {
                    let _ = inbound.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(target) else {
                    let _ = inbound.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                {
                    let mut open = open.lock().unwrap();
                    open.retain(|s| s.peer_addr().is_ok());
                    for s in [&inbound, &outbound] {
                        if let Ok(c) = s.try_clone() {
                            open.push(c);
                        }
                    }
                }
                for (from, to) in [(&inbound, &outbound), (&outbound, &inbound)] {
                    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                        continue;
                    };
                    let cut = cut.clone();
                    thread::spawn(move || {
                        let mut buf = [0u8; 16 * 1024];
                        loop {
                            match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    if cut.load(Ordering::SeqCst)
                                        || to.write_all(&buf[..n]).is_err()
                                    {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = from.shutdown(Shutdown::Both);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        proxy
    }

    /// Cut: close every relayed connection, refuse new ones until [`CutProxy::heal`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Relay again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees `stop`.
        let _ = TcpStream::connect(self.addr);
    }
}
