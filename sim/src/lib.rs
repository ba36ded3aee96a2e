//! A trace-driven cluster simulator driving the real policy code through its traits.
#![forbid(unsafe_code)]
