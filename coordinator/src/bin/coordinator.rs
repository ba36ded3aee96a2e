//! `coordinator`: the cluster service.
fn main() {
    eprintln!("coordinator: not implemented yet");
    std::process::exit(2);
}
