//! The Rust SDK of Weir hook plugins: typed views over the batch layout of
//! docs/plugin-abi.md (ABI versions 1 and 2), read and edited in place, and
//! the exports Weir calls. It has no dependencies and builds with Rust 1.63
//! (Debian 12's rustc) for `wasm32-wasi` (`wasm32-wasip1` on newer Rust).
//!
//! A plugin is a `cdylib` crate:
//!
//! ```ignore
//! use weir_plugin::{export_plugin, Batch, Plugin};
//!
//! #[derive(Default)]
//! struct Drain;
//!
//! impl Plugin for Drain {
//!     fn process(&mut self, batch: &mut Batch<'_>) -> Result<(), String> {
//!         for i in 0..batch.len() {
//!             batch.service_mut(i).keep(|e| !e.terminating());
//!         }
//!         Ok(())
//!     }
//! }
//!
//! export_plugin!(Drain);
//! ```
//!
//! The SDK speaks ABI version 2 (`weir_abi_version` returns 2) and reads
//! and edits batches of both versions: Weir sends version 1 batches unless
//! the plugin's configuration asks for signals (`signals: [connections]`),
//! and then version 2 batches, whose endpoints carry their active and new
//! connection counts (`Endpoint::active`, `Endpoint::new_connections`; 0 in
//! a version 1 batch). `Batch::version` tells which one a batch is.
//!
//! The views check nothing again after `Batch::parse`, and their index
//! arguments panic when out of range, like slices. A panic logs one line
//! with its location to stderr (Weir's log) and fails the batch.

mod batch;
mod endpoint;
pub mod guest;
mod layout;
mod service;

pub use batch::{Batch, Error};
pub use endpoint::{Endpoint, FOR_CLUSTER, FOR_LOCAL, LOCAL, READY, SERVING, TERMINATING};
pub use guest::{is_null, log, Plugin, Status};
pub use layout::{
    ENDPOINT_SIZE, ENDPOINT_SIZE_V2, HEADER_SIZE, MAGIC, MAX_AFFINITY_SECONDS, SERVICE_HEADER_SIZE,
    VERSION, VERSION_1, VERSION_2,
};
pub use service::{Pairs, Protocol, Scheduler, Service, ServiceMut, SourceRange, SCHEDULERS};

/// The newest ABI version this SDK speaks, returned by `weir_abi_version`:
/// a plugin built on it may be sent batches of version 1 or 2.
pub const ABI_VERSION: i32 = VERSION as i32;

#[cfg(test)]
mod tests;
