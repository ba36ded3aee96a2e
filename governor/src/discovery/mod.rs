//! Finding training jobs, runtime-agnostically: declared job files, processes carrying
//! `GOVERNOR_LOG` in their environment, and jobs launched by `governor run-job`.
pub mod adopt;
pub mod names;
pub mod procfs;
pub mod scan;
