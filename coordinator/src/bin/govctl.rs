//! `govctl`: the cluster view CLI.
fn main() {
    eprintln!("govctl: not implemented yet");
    std::process::exit(2);
}
