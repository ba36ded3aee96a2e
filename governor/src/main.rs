//! `governor`: the per-node daemon and its operator commands. All logic lives in the library.
fn main() -> std::process::ExitCode {
    governor::cli::main()
}
