//! The only module that touches cgroupfs.
