//! The cluster coordinator: node and job registry, placement policies, queue, gRPC service.
#![forbid(unsafe_code)]
