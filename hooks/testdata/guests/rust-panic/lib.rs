//! A test guest written with the Rust SDK whose `weir_process` panics: it
//! reads one endpoint past the last of the first service, which the SDK
//! refuses like a slice index. hooks/rust_test.go checks that the panic
//! hook names this file's line.

use weir_plugin::{export_plugin, Batch, Plugin};

#[derive(Default)]
struct Panicky;

impl Plugin for Panicky {
    fn process(&mut self, batch: &mut Batch<'_>) -> Result<(), String> {
        let service = batch.service(0);
        let past_the_end = service.endpoint(service.len());
        Err(format!("unreachable: read endpoint {}", past_the_end.id()))
    }
}

export_plugin!(Panicky);
