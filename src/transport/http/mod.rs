//! Synapse's replication HTTP API over hyper: catch-up from a writer
//! (`catch_up`) and calls to other processes' endpoints (`call`), feature
//! `http-catch-up`; serving both to Synapse's processes (`server`, feature
//! `http-server`). Paths, bodies and answers
//! are sans-IO, in [`positions`](crate::positions); hyper moves the bytes.

#[cfg(feature = "http-catch-up")]
pub(crate) mod call;
#[cfg(feature = "http-catch-up")]
pub(crate) mod catch_up;
mod hyper_io;
#[cfg(feature = "http-server")]
pub(crate) mod server;
