//! dispatch
