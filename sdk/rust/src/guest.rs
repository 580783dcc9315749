//! The guest runtime: the plugin trait, the exports' bodies, memory for the
//! host, logging and the panic hook.

use std::alloc::{alloc as std_alloc, dealloc, Layout};
use std::any::Any;
use std::cell::Cell;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe, Location};
use std::sync::Once;

use crate::batch::Batch;

/// A call's result code, as docs/plugin-abi.md numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Success (weir_configure only).
    Ok = 0,
    /// The plugin could not read the batch or configuration.
    BadInput = 1,
    /// The plugin panicked.
    Panic = 2,
    /// The plugin's own logic refused the batch.
    Failed = 3,
    /// The configuration is not acceptable.
    BadConfig = 4,
}

/// What a Rust plugin implements; `export_plugin!` turns it into the exports.
///
/// Weir makes a fresh instance (so a fresh `Default` value) for every
/// instance of the module, calls `configure` once on it, then `process` for
/// each batch. Nothing survives a failed call: Weir discards the instance.
pub trait Plugin: Default {
    /// Receives the plugin's `config` as JSON (`null` when absent); an error
    /// refuses it. The default accepts only no configuration.
    fn configure(&mut self, config: &[u8]) -> Result<(), String> {
        if is_null(config) {
            Ok(())
        } else {
            Err("config: this plugin takes no configuration".to_string())
        }
    }

    /// Edits the batch in place; an error fails the batch (status Failed).
    fn process(&mut self, batch: &mut Batch<'_>) -> Result<(), String>;
}

/// Reports whether a configuration is empty or JSON `null`.
pub fn is_null(config: &[u8]) -> bool {
    let start = config.iter().position(|b| !b.is_ascii_whitespace());
    let end = config.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &config[s..=e] == b"null",
        _ => true,
    }
}

/// Writes one line to stderr (Weir's log) in a single write; errors are
/// ignored, since a failed log write must not fail the plugin.
pub fn log(line: &str) {
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// Calls `p.configure` and returns the status for `weir_configure`.
pub fn configure<P: Plugin>(p: &mut P, config: &[u8]) -> Status {
    guarded("weir_configure", || match p.configure(config) {
        Ok(()) => Status::Ok,
        Err(reason) => {
            log(&reason);
            Status::BadConfig
        }
    })
}

/// Parses `buf` and calls `p.process` on it; the output is `buf` itself.
pub fn process<P: Plugin>(p: &mut P, buf: &mut [u8]) -> Status {
    guarded("weir_process", || {
        let mut batch = match Batch::parse(buf) {
            Ok(b) => b,
            Err(e) => {
                log(&format!("weir_process: bad batch: {e}"));
                return Status::BadInput;
            }
        };
        match p.process(&mut batch) {
            Ok(()) => Status::Ok,
            Err(reason) => {
                log(&format!("weir_process: {reason}"));
                Status::Failed
            }
        }
    })
}

thread_local! {
    /// The export running now, for the panic hook's line.
    static CURRENT: Cell<&'static str> = const { Cell::new("weir") };
}

static HOOK: Once = Once::new();

/// Runs `f` as export `name`: with the panic hook installed, and turning a
/// panic into status Panic where panics unwind (natively). On wasm32-wasi
/// Rust panics abort: the hook logs the line, then the call traps, which
/// Weir treats as a failure too.
fn guarded<F: FnOnce() -> Status>(name: &'static str, f: F) -> Status {
    HOOK.call_once(|| {
        panic::set_hook(Box::new(|info| {
            let name = CURRENT.with(Cell::get);
            log(&panic_line(name, info.location(), info.payload()));
        }))
    });
    CURRENT.with(|c| c.set(name));
    panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(Status::Panic)
}

/// Formats the panic hook's line: `export: panic at file:line:column: message`.
pub fn panic_line(export: &str, at: Option<&Location<'_>>, payload: &(dyn Any + Send)) -> String {
    let msg = if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.as_str()
    } else {
        "(no message)"
    };
    match at {
        Some(l) => format!(
            "{export}: panic at {}:{}:{}: {msg}",
            l.file(),
            l.line(),
            l.column()
        ),
        None => format!("{export}: panic: {msg}"),
    }
}

/// Bytes kept in front of each block: its total size, for `free`. Also the blocks' alignment.
const BLOCK_HEADER: usize = 8;

/// Returns a pointer to `size` writable bytes aligned to 8, or null when memory is exhausted.
pub fn alloc(size: u32) -> *mut u8 {
    let total = match (size as usize).checked_add(BLOCK_HEADER) {
        Some(t) => t,
        None => return std::ptr::null_mut(),
    };
    let layout = match Layout::from_size_align(total, BLOCK_HEADER) {
        Ok(l) => l,
        Err(_) => return std::ptr::null_mut(),
    };
    // SAFETY: the layout's size is at least 8; the size header lies inside the block.
    unsafe {
        let base = std_alloc(layout);
        if base.is_null() {
            return base;
        }
        base.cast::<usize>().write(total);
        base.add(BLOCK_HEADER)
    }
}

/// Releases a block from `alloc`; null is ignored.
///
/// # Safety
/// `ptr` must be null or a pointer `alloc` returned and not yet freed.
pub unsafe fn free(ptr: *mut u8) {
    if ptr.is_null() {
        return;
    }
    let base = ptr.sub(BLOCK_HEADER);
    let total = base.cast::<usize>().read();
    dealloc(base, Layout::from_size_align_unchecked(total, BLOCK_HEADER));
}

/// The body of the `weir_configure` export.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes.
pub unsafe fn configure_export<P: Plugin>(p: &mut P, ptr: *const u8, len: u32) -> u32 {
    let config: &[u8] = if ptr.is_null() || len == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, len as usize)
    };
    configure(p, config) as u32
}

/// The body of the `weir_process` export: the batch is edited in place and
/// returned as `ptr << 32 | len`, or a status.
///
/// # Safety
/// `ptr` must be null or point to `len` writable bytes.
pub unsafe fn process_export<P: Plugin>(p: &mut P, ptr: *mut u8, len: u32) -> u64 {
    if ptr.is_null() {
        log("weir_process: the batch pointer is 0");
        return Status::BadInput as u64;
    }
    let buf = std::slice::from_raw_parts_mut(ptr, len as usize);
    match process(p, buf) {
        Status::Ok => (u64::from(ptr as usize as u32) << 32) | u64::from(len),
        status => status as u64,
    }
}

/// Defines the exports Weir calls for the plugin type `$plugin` (which
/// implements `Plugin` and `Default`): `weir_abi_version`, `weir_alloc`,
/// `weir_free`, `weir_configure` and `weir_process`. Invoke it once, at
/// the root of a `cdylib` crate.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        ::std::thread_local! {
            static WEIR_PLUGIN: ::core::cell::RefCell<$plugin> =
                ::core::cell::RefCell::new(<$plugin as ::core::default::Default>::default());
        }

        /// Returns the ABI version this plugin speaks.
        #[no_mangle]
        pub extern "C" fn weir_abi_version() -> i32 {
            $crate::ABI_VERSION
        }

        /// Returns `size` writable bytes for Weir, aligned to 8; null on failure.
        #[no_mangle]
        pub extern "C" fn weir_alloc(size: u32) -> *mut u8 {
            $crate::guest::alloc(size)
        }

        /// Releases a block from `weir_alloc`.
        ///
        /// # Safety
        /// Weir passes only pointers `weir_alloc` returned.
        #[no_mangle]
        pub unsafe extern "C" fn weir_free(ptr: *mut u8) {
            $crate::guest::free(ptr)
        }

        /// Configures the plugin from its JSON config.
        ///
        /// # Safety
        /// Weir passes a block from `weir_alloc` holding `len` bytes.
        #[no_mangle]
        pub unsafe extern "C" fn weir_configure(ptr: *const u8, len: u32) -> u32 {
            WEIR_PLUGIN.with(|p| $crate::guest::configure_export(&mut *p.borrow_mut(), ptr, len))
        }

        /// Processes one batch in place.
        ///
        /// # Safety
        /// Weir passes a block from `weir_alloc` holding `len` bytes.
        #[no_mangle]
        pub unsafe extern "C" fn weir_process(ptr: *mut u8, len: u32) -> u64 {
            WEIR_PLUGIN.with(|p| $crate::guest::process_export(&mut *p.borrow_mut(), ptr, len))
        }
    };
}
