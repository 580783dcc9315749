//! The fixed numbers of the ABI (versions 1 and 2) and little-endian reads
//! and writes.
//!
//! Every read takes an offset that the batch check has already bounds-checked,
//! so the indexing here cannot panic on a parsed batch.

/// The batch header's first word, the bytes "WEIR".
pub const MAGIC: u32 = 0x5249_4557;
/// The newest batch layout version this SDK reads and edits; it reads and
/// edits version 1 too.
pub const VERSION: u16 = VERSION_2;
/// ABI version 1: no signals, 52-byte endpoint records.
pub const VERSION_1: u16 = 1;
/// ABI version 2: each endpoint's live signals, 60-byte endpoint records
/// (version 1's 52 bytes, then the active and new connection counts). Weir
/// sends it only to a plugin configured with `signals:`.
pub const VERSION_2: u16 = 2;
/// The header flag marking a batch that holds every service the plugin matches.
pub const FLAG_FULL: u16 = 1;
/// The size of the batch header before the record table.
pub const HEADER_SIZE: usize = 32;
/// The size of a service record before its arrays.
pub const SERVICE_HEADER_SIZE: usize = 64;
/// The size of an endpoint record in version 1.
pub const ENDPOINT_SIZE: usize = 52;
/// The size of an endpoint record in version 2.
pub const ENDPOINT_SIZE_V2: usize = 60;
/// The longest affinity timeout a plugin may set, in seconds.
pub const MAX_AFFINITY_SECONDS: u32 = 86400;

pub(crate) const STR_SIZE: usize = 8;
pub(crate) const ADDR_SIZE: usize = 16;
pub(crate) const RANGE_SIZE: usize = 20;
pub(crate) const PAIR_SIZE: usize = 16;

// Header field offsets.
pub(crate) const H_VERSION: usize = 4;
pub(crate) const H_FLAGS: usize = 6;
pub(crate) const H_COUNT: usize = 8;
pub(crate) const H_STRINGS: usize = 12;
pub(crate) const H_NODE_NAME: usize = 16;
pub(crate) const H_NODE_ZONE: usize = 24;

// Service record field offsets.
pub(crate) const S_SIZE: usize = 0;
pub(crate) const S_PROTOCOL: usize = 4;
pub(crate) const S_SCHEDULER: usize = 5;
pub(crate) const S_FLAGS: usize = 6;
pub(crate) const S_PORT: usize = 8;
pub(crate) const S_NODE_PORT: usize = 10;
pub(crate) const S_HEALTH_PORT: usize = 12;
pub(crate) const S_AFFINITY: usize = 16;
pub(crate) const S_ENDPOINTS: usize = 20;
pub(crate) const S_NAMESPACE: usize = 24;
pub(crate) const S_NAME: usize = 32;
pub(crate) const S_PORT_NAME: usize = 40;
pub(crate) const S_CLUSTER_IPS: usize = 48;
pub(crate) const S_EXTERNAL_IPS: usize = 50;
pub(crate) const S_LB_IPS: usize = 52;
pub(crate) const S_RANGES: usize = 54;
pub(crate) const S_LABELS: usize = 56;
pub(crate) const S_ANNOTATIONS: usize = 58;
pub(crate) const S_ENDPOINTS_OFF: usize = 60;

// Endpoint record field offsets.
pub(crate) const E_PORT: usize = 16;
pub(crate) const E_FLAGS: usize = 18;
pub(crate) const E_WEIGHT: usize = 20;
pub(crate) const E_ID: usize = 24;
pub(crate) const E_NODE: usize = 28;
pub(crate) const E_ZONE: usize = 36;
pub(crate) const E_POD: usize = 44;
pub(crate) const E_ACTIVE: usize = 52; // version 2
pub(crate) const E_NEW: usize = 56; // version 2

/// Returns the size of an endpoint record in batch layout `version`, or
/// None for a version this SDK does not read.
pub(crate) fn endpoint_size(version: u16) -> Option<usize> {
    match version {
        VERSION_1 => Some(ENDPOINT_SIZE),
        VERSION_2 => Some(ENDPOINT_SIZE_V2),
        _ => None,
    }
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Returns the bytes of the string whose descriptor is at `off`, or None
/// when the descriptor or the bytes lie outside `b`.
pub(crate) fn str_bytes(b: &[u8], off: usize) -> Option<&[u8]> {
    if off.checked_add(STR_SIZE)? > b.len() {
        return None;
    }
    let (o, n) = (u32_at(b, off) as usize, u32_at(b, off + 4) as usize);
    if n == 0 {
        return Some(&[]);
    }
    b.get(o..o.checked_add(n)?)
}

/// Returns the string whose descriptor is at `off`; "" when it lies outside
/// `b` or is not UTF-8 (Weir writes only UTF-8).
pub(crate) fn str_at(b: &[u8], off: usize) -> &str {
    str_bytes(b, off)
        .and_then(|s| std::str::from_utf8(s).ok())
        .unwrap_or("")
}

/// The array counts of one service record.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub cluster_ips: usize,
    pub external_ips: usize,
    pub lb_ips: usize,
    pub ranges: usize,
    pub labels: usize,
    pub annotations: usize,
    pub endpoints: usize,
}

impl Shape {
    /// Reads the counts of the record at `off` (64 bytes must be in bounds).
    pub fn at(b: &[u8], off: usize) -> Shape {
        let c = |f: usize| u16_at(b, off + f) as usize;
        Shape {
            cluster_ips: c(S_CLUSTER_IPS),
            external_ips: c(S_EXTERNAL_IPS),
            lb_ips: c(S_LB_IPS),
            ranges: c(S_RANGES),
            labels: c(S_LABELS),
            annotations: c(S_ANNOTATIONS),
            endpoints: u32_at(b, off + S_ENDPOINTS) as usize,
        }
    }

    /// The offset of the source ranges from the record's start.
    pub fn ranges_off(&self) -> usize {
        SERVICE_HEADER_SIZE + ADDR_SIZE * (self.cluster_ips + self.external_ips + self.lb_ips)
    }

    /// The offset of the labels from the record's start.
    pub fn pairs_off(&self) -> usize {
        self.ranges_off() + RANGE_SIZE * self.ranges
    }

    /// The smallest offset the endpoint array may have.
    pub fn endpoints_off(&self) -> usize {
        self.pairs_off() + PAIR_SIZE * (self.labels + self.annotations)
    }
}
