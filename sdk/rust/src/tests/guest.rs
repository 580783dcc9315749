//! Tests of the guest runtime: statuses, memory and the exports, run natively.

use std::panic::Location;

use super::read;
use crate::guest::{self, alloc, free, panic_line, process_export};
use crate::{Batch, Plugin, Status};

/// A plugin whose behaviour each batch chooses by the first service's port.
#[derive(Default)]
struct Probe {
    calls: u32,
}

impl Plugin for Probe {
    fn process(&mut self, batch: &mut Batch<'_>) -> Result<(), String> {
        self.calls += 1;
        match batch.service(0).port() {
            80 => {
                batch.service_mut(0).set_weight(0, 5);
                Ok(())
            }
            443 => Err("refused".to_string()),
            _ => panic!("probe panics"),
        }
    }
}

crate::export_plugin!(Probe);

#[test]
fn default_configure_accepts_only_null() {
    let mut p = Probe::default();
    for ok in ["", "null", " null\n"] {
        assert_eq!(
            guest::configure(&mut p, ok.as_bytes()),
            Status::Ok,
            "{ok:?}"
        );
    }
    for bad in ["{}", "nul", "null null", "3"] {
        assert_eq!(
            guest::configure(&mut p, bad.as_bytes()),
            Status::BadConfig,
            "{bad:?}"
        );
    }
}

#[test]
fn process_statuses() {
    let mut p = Probe::default();
    let mut simple = read("batches/simple.bin"); // port 80
    assert_eq!(guest::process(&mut p, &mut simple), Status::Ok);
    assert_eq!(
        Batch::parse(&mut simple)
            .unwrap()
            .service(0)
            .endpoint(0)
            .weight(),
        5
    );
    let mut every = read("batches/every-field.bin"); // port 443
    assert_eq!(guest::process(&mut p, &mut every), Status::Failed);
    let mut ipv6 = read("batches/ipv6.bin"); // port 53
    assert_eq!(guest::process(&mut p, &mut ipv6), Status::Panic);
    let mut signals = read("batches/signals.bin"); // version 2, port 80 first
    assert_eq!(guest::process(&mut p, &mut signals), Status::Ok);
    let b = Batch::parse(&mut signals).unwrap();
    let e = b.service(0).endpoint(0);
    assert_eq!((b.version(), e.weight(), e.active()), (2, 5, 3));
    let mut bad = vec![0u8; 40];
    assert_eq!(guest::process(&mut p, &mut bad), Status::BadInput);
    assert_eq!(p.calls, 4, "process ran for a batch that did not parse");
}

#[test]
fn alloc_aligns_and_frees() {
    for size in [0u32, 1, 7, 52, 1 << 20] {
        let p = alloc(size);
        assert!(!p.is_null(), "alloc({size}) failed");
        assert_eq!(p as usize % 8, 0, "alloc({size}) is not 8-aligned");
        // SAFETY: p points to size writable bytes and is freed once.
        unsafe {
            std::ptr::write_bytes(p, 0xab, size as usize);
            free(p);
        }
    }
    assert!(alloc(u32::MAX).is_null() || cfg!(target_pointer_width = "64"));
    // SAFETY: null is allowed.
    unsafe { free(std::ptr::null_mut()) };
}

#[test]
fn exports_round_trip() {
    assert_eq!(weir_abi_version(), 2);
    let batch = read("batches/simple.bin");
    let ptr = weir_alloc(batch.len() as u32);
    // SAFETY: ptr holds batch.len() bytes from weir_alloc.
    let result = unsafe {
        std::ptr::copy_nonoverlapping(batch.as_ptr(), ptr, batch.len());
        assert_eq!(weir_configure(std::ptr::null(), 0), Status::Ok as u32);
        weir_process(ptr, batch.len() as u32)
    };
    assert_eq!(result as u32 as usize, batch.len(), "output length");
    assert_eq!(
        result >> 32,
        u64::from(ptr as usize as u32),
        "output pointer"
    );
    // SAFETY: the output is the input, still allocated.
    let out = unsafe { std::slice::from_raw_parts_mut(ptr, batch.len()) }.to_vec();
    // SAFETY: freed once.
    unsafe { weir_free(ptr) };
    let mut want = read("outputs/simple-reweight.bin");
    assert!(
        out != batch && out.len() == want.len(),
        "the export did not edit the batch"
    );
    let w = Batch::parse(&mut want)
        .unwrap()
        .service(0)
        .endpoint(0)
        .weight();
    assert_eq!(w, 10, "vector sanity");
    // SAFETY: null pointer is refused with a status.
    assert_eq!(
        unsafe { process_export(&mut Probe::default(), std::ptr::null_mut(), 4) },
        Status::BadInput as u64
    );
}

#[test]
fn panic_line_names_the_location() {
    let here = Location::caller();
    let line = panic_line("weir_process", Some(here), &"boom");
    assert_eq!(
        line,
        format!(
            "weir_process: panic at {}:{}:{}: boom",
            here.file(),
            here.line(),
            here.column()
        )
    );
    let owned: String = "formatted 7".to_string();
    assert_eq!(
        panic_line("weir_configure", None, &owned),
        "weir_configure: panic: formatted 7"
    );
    assert_eq!(
        panic_line("weir_process", None, &42u8),
        "weir_process: panic: (no message)"
    );
}
