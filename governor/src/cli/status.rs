//! `governor status`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::control::{self, Request, Response};
use crate::status::render_table;

/// Arguments of `governor status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Print the status as JSON (one object) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Control socket of the daemon.
    #[arg(long, default_value = "/run/governor/governor.sock")]
    pub socket: PathBuf,
    /// Refresh every SECONDS until interrupted.
    #[arg(long, value_name = "SECONDS")]
    pub watch: Option<f64>,
}

pub fn run(args: StatusArgs) -> ExitCode {
    loop {
        match control::request(&args.socket, &Request::Status, Duration::from_secs(5)) {
            Ok(Response::Status(s)) => {
                if args.json {
                    println!("{}", serde_json::to_string(&s).expect("status serialises"));
                } else {
                    if args.watch.is_some() {
                        // Clear the screen and home the cursor for a refreshing view.
                        print!("\x1b[2J\x1b[H");
                    }
                    print!("{}", render_table(&s));
                }
            }
            Ok(Response::Error { message }) => {
                eprintln!("governor status: the daemon answered: {message}");
                return ExitCode::FAILURE;
            }
            Ok(other) => {
                eprintln!("governor status: unexpected answer from the daemon: {other:?}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("governor status: {e}");
                return ExitCode::FAILURE;
            }
        }
        match args.watch {
            Some(secs) if secs > 0.0 => std::thread::sleep(Duration::from_secs_f64(secs)),
            _ => return ExitCode::SUCCESS,
        }
    }
}
