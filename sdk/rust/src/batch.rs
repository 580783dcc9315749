//! The batch: parsing and the header's accessors.

use std::fmt;

use crate::layout::*;
use crate::service::{Service, ServiceMut};

/// Why a buffer is not a batch this SDK can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn fail<T>(reason: String) -> Result<T, Error> {
    Err(Error(format!("weir: {reason}")))
}

/// One batch, read and edited in place in the buffer Weir wrote.
///
/// `parse` checks every record, array and key string, so the accessors never
/// read outside the buffer. An endpoint's strings are checked when read: one
/// outside the buffer reads as "".
///
/// Both layout versions read and edit alike: a version 2 batch's endpoint
/// records are 60 bytes instead of 52 and carry the endpoints' signals
/// (`Endpoint::active`, `Endpoint::new_connections`), which read as 0 in a
/// version 1 batch. Edits move whole records, so the signals travel with
/// their endpoints; the output keeps the input's version.
pub struct Batch<'a> {
    buf: &'a mut [u8],
    len: usize,
    ep: usize, // endpoint record size
}

impl<'a> Batch<'a> {
    /// Checks `buf` (a batch of version 1 or 2) and returns the batch it holds.
    pub fn parse(buf: &'a mut [u8]) -> Result<Batch<'a>, Error> {
        let (len, ep) = check(buf)?;
        Ok(Batch { buf, len, ep })
    }

    /// Returns the batch's layout version: 1, or 2 when it carries signals.
    pub fn version(&self) -> u16 {
        u16_at(self.buf, H_VERSION)
    }

    /// Returns the buffer, with the edits made through the views.
    pub fn bytes(&self) -> &[u8] {
        self.buf
    }

    /// Reports whether the batch holds every service the plugin matches.
    pub fn full(&self) -> bool {
        u16_at(self.buf, H_FLAGS) & FLAG_FULL != 0
    }

    /// Returns the name of the node Weir runs on.
    pub fn node_name(&self) -> &str {
        str_at(self.buf, H_NODE_NAME)
    }

    /// Returns the node's zone, or "" when it has none.
    pub fn node_zone(&self) -> &str {
        str_at(self.buf, H_NODE_ZONE)
    }

    /// Returns the number of services.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Reports whether the batch holds no services.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Returns a view of service `i`; it panics when `i` is out of range.
    #[track_caller]
    pub fn service(&self, i: usize) -> Service<'_> {
        Service::new(self.buf, self.record(i), self.ep)
    }

    /// Returns an editable view of service `i`; it panics when `i` is out of range.
    #[track_caller]
    pub fn service_mut(&mut self, i: usize) -> ServiceMut<'_> {
        let off = self.record(i);
        ServiceMut::new(self.buf, off, self.ep)
    }

    /// Returns the offset of service `i`'s record; it panics when `i` is out of range.
    #[track_caller]
    fn record(&self, i: usize) -> usize {
        if i >= self.len {
            panic!("weir: service index {} out of range [0,{})", i, self.len);
        }
        u32_at(self.buf, HEADER_SIZE + 4 * i) as usize
    }
}

/// Validates a batch's bounds as the Go SDK does and returns its number of
/// services and its endpoint record size.
fn check(buf: &[u8]) -> Result<(usize, usize), Error> {
    if buf.len() < HEADER_SIZE {
        return fail(format!(
            "batch of {} bytes is shorter than its header",
            buf.len()
        ));
    }
    let magic = u32_at(buf, 0);
    if magic != MAGIC {
        return fail(format!("bad magic {magic:#x}"));
    }
    let version = u16_at(buf, H_VERSION);
    let ep = match endpoint_size(version) {
        Some(ep) => ep,
        None => return fail(format!("batch version {version}, want 1 or 2")),
    };
    let n = u32_at(buf, H_COUNT) as usize;
    let table_end = n.checked_mul(4).and_then(|t| t.checked_add(HEADER_SIZE));
    let mut end = match table_end {
        Some(end) if end <= buf.len() => end,
        _ => return fail(format!("record table of {n} services is outside the batch")),
    };
    if u32_at(buf, H_STRINGS) as usize > buf.len() {
        return fail("string area offset is outside the batch".to_string());
    }
    if str_bytes(buf, H_NODE_NAME).is_none() || str_bytes(buf, H_NODE_ZONE).is_none() {
        return fail("node name or zone is outside the batch".to_string());
    }
    for i in 0..n {
        let off = u32_at(buf, HEADER_SIZE + 4 * i) as usize;
        if off < end {
            return fail(format!(
                "service {i}: record offset {off} overlaps the record table or the previous record"
            ));
        }
        if let Err(reason) = check_record(buf, off, ep) {
            return fail(format!("service {i}: {reason}"));
        }
        end = off + u32_at(buf, off + S_SIZE) as usize;
    }
    Ok((n, ep))
}

/// Checks that the record at `off`, its arrays and its key, label and
/// annotation strings lie inside `buf`; its endpoint records are `ep` bytes.
fn check_record(buf: &[u8], off: usize, ep: usize) -> Result<(), String> {
    if off % 4 != 0 {
        return Err(format!("record offset {off} is not a multiple of 4"));
    }
    let fits = |end: u64| end <= buf.len() as u64;
    if !fits(off as u64 + SERVICE_HEADER_SIZE as u64) {
        return Err(format!("record offset {off} is outside the batch"));
    }
    let size = u32_at(buf, off + S_SIZE) as usize;
    if !fits(off as u64 + size as u64) {
        return Err(format!("record size {size} goes past the batch's end"));
    }
    let sh = Shape::at(buf, off);
    let eoff = u32_at(buf, off + S_ENDPOINTS_OFF) as usize;
    if eoff < sh.endpoints_off() || eoff % 4 != 0 {
        return Err(format!(
            "endpoint array offset {eoff} overlaps the arrays before it or is unaligned"
        ));
    }
    if eoff as u64 + ep as u64 * sh.endpoints as u64 > size as u64 {
        return Err(format!(
            "endpoint array of {} endpoints goes past the record's size",
            sh.endpoints
        ));
    }
    for f in [S_NAMESPACE, S_NAME, S_PORT_NAME] {
        if str_bytes(buf, off + f).is_none() {
            return Err("key string is outside the batch".to_string());
        }
    }
    let pairs = (off + sh.pairs_off()..off + sh.endpoints_off()).step_by(STR_SIZE);
    for p in pairs {
        if str_bytes(buf, p).is_none() {
            return Err("label or annotation string is outside the batch".to_string());
        }
    }
    Ok(())
}
