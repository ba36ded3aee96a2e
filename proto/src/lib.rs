//! The cluster protocol: generated gRPC code plus hand-written conversions to domain types.
#![forbid(unsafe_code)]
