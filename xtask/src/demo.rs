//! `cargo xtask demo`: the README's main command.

use anyhow::Result;

use crate::vm::{self, VmTestArgs};

/// Arguments of `cargo xtask demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Node policy to run the jobs under.
    #[arg(long, default_value = "governor")]
    pub policy: String,
}

pub fn run(_args: &DemoArgs) -> Result<()> {
    // The smallest end-to-end thing that exists so far: throttle a busy process in the VM.
    vm::run_vm_test(&VmTestArgs {
        filter: Some("cpu_max_throttles".into()),
        nodes: None,
        timeout_minutes: 20,
    })
}
