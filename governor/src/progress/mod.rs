//! Progress ingestion: follow every job's training progress from the log files its framework
//! already writes (parsers, format detection, progress signal, inotify tailer).
