//! Synapse's replication HTTP API over hyper: catch-up from a writer
//! (`catch_up`, feature `http-catch-up`) and serving catch-up to Synapse's
//! processes (`server`, feature `http-server`). Paths, bodies and answers
//! are sans-IO, in [`positions`](crate::positions); hyper moves the bytes.

#[cfg(feature = "http-catch-up")]
pub(crate) mod catch_up;
mod hyper_io;
#[cfg(feature = "http-server")]
pub(crate) mod server;
