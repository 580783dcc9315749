//! `local-boost` is a Weir hook plugin written in Rust with no crates: it
//! prefers the endpoints that run on this node.
//!
//! For every service whose annotation `local-boost.weir.dev/factor` is an
//! integer from 2 to 100, it multiplies the weight of the endpoints flagged
//! local by that factor (saturating at `u32::MAX`), editing the batch in place.
//! Other services are left untouched; a service with an invalid factor is
//! left untouched and the reason goes to stderr (Weir's log).
//!
//! It implements `docs/plugin-abi.md` version 1 directly, without the Go SDK.
//! Every read is bounds-checked so a malformed batch gives status `BadInput`
//! rather than a trap.

use std::alloc::{alloc, dealloc, Layout};
use std::io::Write;
use std::ptr::null_mut;
use std::slice;

const ABI_VERSION: i32 = 1;
const MAGIC: u32 = 0x5249_4557;
const BATCH_VERSION: u16 = 1;

const STATUS_OK: u32 = 0;
const STATUS_BAD_INPUT: u32 = 1;
const STATUS_BAD_CONFIG: u32 = 4;

const HEADER_SIZE: usize = 32;
const SERVICE_SIZE: usize = 64;
const ENDPOINT_SIZE: usize = 52;
const ADDRESS_SIZE: usize = 16;
const RANGE_SIZE: usize = 20;
const PAIR_SIZE: usize = 16;
const ENDPOINT_LOCAL: u16 = 8;

const ANNOTATION: &str = "local-boost.weir.dev/factor";
const MIN_FACTOR: u32 = 2;
const MAX_FACTOR: u32 = 100;

/// Bytes kept in front of every `weir_alloc` block: the block's total size,
/// so that `weir_free` can rebuild its `Layout`. Also the blocks' alignment.
const ALLOC_HEADER: usize = 8;

/// Returns the ABI version this plugin speaks.
#[no_mangle]
pub extern "C" fn weir_abi_version() -> i32 {
    ABI_VERSION
}

/// Returns a pointer to `size` writable bytes aligned to 8, or 0 when memory is exhausted.
#[no_mangle]
pub extern "C" fn weir_alloc(size: u32) -> *mut u8 {
    let total = match (size as usize).checked_add(ALLOC_HEADER) {
        Some(total) => total,
        None => return null_mut(),
    };
    let layout = match Layout::from_size_align(total, ALLOC_HEADER) {
        Ok(layout) => layout,
        Err(_) => return null_mut(),
    };
    // SAFETY: layout has a non-zero size; the size header lies inside the block.
    unsafe {
        let base = alloc(layout);
        if base.is_null() {
            return null_mut();
        }
        base.cast::<usize>().write(total);
        base.add(ALLOC_HEADER)
    }
}

/// Releases a block returned by `weir_alloc` (or `weir_process`, which returns its input).
///
/// # Safety
/// `ptr` must be 0 or a pointer returned by `weir_alloc` and not yet freed.
#[no_mangle]
pub unsafe extern "C" fn weir_free(ptr: *mut u8) {
    if ptr.is_null() {
        return;
    }
    let base = ptr.sub(ALLOC_HEADER);
    let total = base.cast::<usize>().read();
    dealloc(base, Layout::from_size_align_unchecked(total, ALLOC_HEADER));
}

/// Accepts only an absent configuration (JSON `null`); anything else is `BadConfig`.
///
/// # Safety
/// `ptr` must point to `len` readable bytes (Weir passes a `weir_alloc` block).
#[no_mangle]
pub unsafe extern "C" fn weir_configure(ptr: *const u8, len: u32) -> u32 {
    let config: &[u8] = if ptr.is_null() || len == 0 {
        &[]
    } else {
        slice::from_raw_parts(ptr, len as usize)
    };
    let config = trim_space(config);
    if config.is_empty() || config == b"null" {
        return STATUS_OK;
    }
    log(&format!(
        "config must be null: local-boost reads the annotation {ANNOTATION} of each service; got {}",
        preview(config)
    ));
    STATUS_BAD_CONFIG
}

/// Boosts the local endpoints of one batch in place and returns `ptr << 32 | len`,
/// or status `BadInput` when the batch is malformed.
///
/// # Safety
/// `ptr` must point to `len` writable bytes (Weir passes a `weir_alloc` block).
#[no_mangle]
pub unsafe extern "C" fn weir_process(ptr: *mut u8, len: u32) -> u64 {
    if ptr.is_null() {
        log("bad batch: pointer is 0");
        return u64::from(STATUS_BAD_INPUT);
    }
    let batch = slice::from_raw_parts_mut(ptr, len as usize);
    match process(batch) {
        Ok(()) => (u64::from(ptr as usize as u32) << 32) | u64::from(len),
        Err(reason) => {
            log(&format!("bad batch: {reason}"));
            u64::from(STATUS_BAD_INPUT)
        }
    }
}

/// Checks the batch header and boosts every service in it.
fn process(batch: &mut [u8]) -> Result<(), String> {
    let magic = read_u32(batch, 0)?;
    if magic != MAGIC {
        return Err(format!("magic is {magic:#010x}, want {MAGIC:#010x}"));
    }
    let version = read_u16(batch, 4)?;
    if version != BATCH_VERSION {
        return Err(format!("version is {version}, want {BATCH_VERSION}"));
    }
    let count = read_u32(batch, 8)? as usize;
    let table_end = count
        .checked_mul(4)
        .and_then(|n| n.checked_add(HEADER_SIZE));
    if table_end.filter(|&end| end <= batch.len()).is_none() {
        return Err(format!(
            "{} services do not fit a {}-byte batch",
            count,
            batch.len()
        ));
    }
    for index in 0..count {
        let start = read_u32(batch, HEADER_SIZE + 4 * index)? as usize;
        boost_service(batch, start).map_err(|e| format!("service {index}: {e}"))?;
    }
    Ok(())
}

/// Multiplies the weights of the local endpoints of the service record at
/// `start` by its factor annotation, if it has a valid one.
fn boost_service(batch: &mut [u8], start: usize) -> Result<(), String> {
    let end = record_end(batch, start)?;
    let factor = match find_factor(batch, start, end)? {
        Some(factor) => factor,
        None => return Ok(()),
    };
    let count = read_u32(batch, start + 20)? as usize;
    let first = start + read_u32(batch, start + 60)? as usize;
    let last = count
        .checked_mul(ENDPOINT_SIZE)
        .and_then(|size| first.checked_add(size));
    if first < start + SERVICE_SIZE || last.filter(|&last| last <= end).is_none() {
        return Err(format!(
            "{} endpoints at record offset {} do not fit its {} bytes",
            count,
            first - start,
            end - start
        ));
    }
    for at in (first..first + count * ENDPOINT_SIZE).step_by(ENDPOINT_SIZE) {
        if read_u16(batch, at + 18)? & ENDPOINT_LOCAL != 0 {
            let weight = read_u32(batch, at + 20)?;
            write_u32(batch, at + 20, weight.saturating_mul(factor))?;
        }
    }
    Ok(())
}

/// Returns the end of the service record at `start` after checking that it lies in the batch.
fn record_end(batch: &[u8], start: usize) -> Result<usize, String> {
    if start % 4 != 0 {
        return Err(format!("record offset {start} is not a multiple of 4"));
    }
    let size = read_u32(batch, start)? as usize;
    match start.checked_add(size) {
        Some(end) if size >= SERVICE_SIZE && end <= batch.len() => Ok(end),
        _ => Err(format!(
            "record of {} bytes at offset {} does not fit the {}-byte batch",
            size,
            start,
            batch.len()
        )),
    }
}

/// Returns the service's boost factor: None when the annotation is absent or
/// invalid (the reason for an invalid one is logged).
fn find_factor(batch: &[u8], start: usize, end: usize) -> Result<Option<u32>, String> {
    let field = |at: usize| read_u16(batch, start + at).map(|n| n as usize);
    let addresses = field(48)? + field(50)? + field(52)?;
    let ranges = field(54)?;
    let labels = field(56)?;
    let annotations = field(58)?;
    let first =
        start + SERVICE_SIZE + addresses * ADDRESS_SIZE + ranges * RANGE_SIZE + labels * PAIR_SIZE;
    if first + annotations * PAIR_SIZE > end {
        return Err(format!(
            "{} annotations do not fit the {}-byte record",
            annotations,
            end - start
        ));
    }
    for at in (first..first + annotations * PAIR_SIZE).step_by(PAIR_SIZE) {
        if read_str(batch, at)? != ANNOTATION.as_bytes() {
            continue;
        }
        let value = read_str(batch, at + 8)?;
        let factor = parse_factor(value);
        if factor.is_none() {
            log(&format!(
                "service {}: annotation {ANNOTATION} is {}, want an integer from {MIN_FACTOR} to {MAX_FACTOR}; left unchanged",
                service_key(batch, start)?,
                preview(value)
            ));
        }
        return Ok(factor);
    }
    Ok(None)
}

/// Parses a factor: decimal digits only, from `MIN_FACTOR` to `MAX_FACTOR`.
fn parse_factor(value: &[u8]) -> Option<u32> {
    if value.is_empty() || value.len() > 3 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let factor = value
        .iter()
        .fold(0, |n, digit| n * 10 + u32::from(digit - b'0'));
    if (MIN_FACTOR..=MAX_FACTOR).contains(&factor) {
        Some(factor)
    } else {
        None
    }
}

/// Returns the service's key as Weir prints it: namespace/name:port/protocol.
fn service_key(batch: &[u8], start: usize) -> Result<String, String> {
    let protocol = match batch.get(start + 4) {
        Some(1) => "TCP",
        Some(2) => "UDP",
        Some(3) => "SCTP",
        _ => "?",
    };
    Ok(format!(
        "{}/{}:{}/{}",
        String::from_utf8_lossy(read_str(batch, start + 24)?),
        String::from_utf8_lossy(read_str(batch, start + 32)?),
        String::from_utf8_lossy(read_str(batch, start + 40)?),
        protocol
    ))
}

/// Returns the bytes of the string whose (offset, length) pair is at `at`.
fn read_str(batch: &[u8], at: usize) -> Result<&[u8], String> {
    let offset = read_u32(batch, at)? as usize;
    let len = read_u32(batch, at + 4)? as usize;
    offset
        .checked_add(len)
        .and_then(|end| batch.get(offset..end))
        .ok_or_else(|| format!("string of {len} bytes at offset {offset} is outside the batch"))
}

fn read_u16(batch: &[u8], at: usize) -> Result<u16, String> {
    match batch.get(at..at.wrapping_add(2)) {
        Some(&[a, b]) => Ok(u16::from_le_bytes([a, b])),
        _ => Err(format!("offset {at} is outside the batch")),
    }
}

fn read_u32(batch: &[u8], at: usize) -> Result<u32, String> {
    match batch.get(at..at.wrapping_add(4)) {
        Some(&[a, b, c, d]) => Ok(u32::from_le_bytes([a, b, c, d])),
        _ => Err(format!("offset {at} is outside the batch")),
    }
}

fn write_u32(batch: &mut [u8], at: usize, value: u32) -> Result<(), String> {
    match batch.get_mut(at..at.wrapping_add(4)) {
        Some(bytes) => {
            bytes.copy_from_slice(&value.to_le_bytes());
            Ok(())
        }
        None => Err(format!("offset {at} is outside the batch")),
    }
}

/// Returns `bytes` quoted, with invalid UTF-8 replaced and cut to 64 characters,
/// to keep a log line under Weir's 512-byte limit.
fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut cut: String = text.chars().take(64).collect();
    if cut.len() < text.len() {
        cut.push_str("...");
    }
    format!("{cut:?}")
}

fn trim_space(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(start), Some(end)) => &bytes[start..=end],
        _ => &[],
    }
}

/// Writes one line to stderr in a single write; errors are ignored, since
/// `eprintln!` would panic (and trap) if the write failed.
fn log(line: &str) {
    let mut text = String::with_capacity(line.len() + 1);
    text.push_str(line);
    text.push('\n');
    let _ = std::io::stderr().write_all(text.as_bytes());
}
