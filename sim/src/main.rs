//! `govsim`: the simulator's command line.
fn main() {
    eprintln!("govsim: not implemented yet");
    std::process::exit(2);
}
