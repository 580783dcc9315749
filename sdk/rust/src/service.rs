//! Views of one service record: read-only and editable.

use std::cmp::Ordering;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::endpoint::Endpoint;
use crate::layout::*;

/// A service port's transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// Code 1.
    Tcp,
    /// Code 2.
    Udp,
    /// Code 3.
    Sctp,
}

impl Protocol {
    /// Returns the protocol with ABI code `code`, or None for an unknown one.
    pub fn from_code(code: u8) -> Option<Protocol> {
        match code {
            1 => Some(Protocol::Tcp),
            2 => Some(Protocol::Udp),
            3 => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Returns the protocol's name as Kubernetes spells it: "TCP", "UDP" or "SCTP".
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// A scheduler hint, in ABI code order (the discriminant is the code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Scheduler {
    /// The backend's default (code 0).
    Default = 0,
    /// Round robin, "rr".
    RoundRobin = 1,
    /// Weighted round robin, "wrr".
    WeightedRoundRobin = 2,
    /// Least connection, "lc".
    LeastConnection = 3,
    /// Weighted least connection, "wlc".
    WeightedLeastConnection = 4,
    /// Source hashing, "sh".
    SourceHash = 5,
    /// Maglev hashing, "mh".
    MaglevHash = 6,
}

/// Every scheduler, indexed by its ABI code.
pub const SCHEDULERS: [Scheduler; 7] = [
    Scheduler::Default,
    Scheduler::RoundRobin,
    Scheduler::WeightedRoundRobin,
    Scheduler::LeastConnection,
    Scheduler::WeightedLeastConnection,
    Scheduler::SourceHash,
    Scheduler::MaglevHash,
];

impl Scheduler {
    /// Returns the scheduler with ABI code `code`, or None for an unknown one.
    pub fn from_code(code: u8) -> Option<Scheduler> {
        SCHEDULERS.get(code as usize).copied()
    }

    /// Returns the scheduler's name as IPVS spells it; "" for the default.
    pub fn name(self) -> &'static str {
        ["", "rr", "wrr", "lc", "wlc", "sh", "mh"][self as usize]
    }
}

/// A source range: an address and a prefix length (IPv4 lengths count IPv4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRange {
    /// The range's first address.
    pub addr: IpAddr,
    /// The prefix length in bits.
    pub bits: u8,
}

impl fmt::Display for SourceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

/// Reads a 16-byte address; IPv4-mapped addresses come back as IPv4.
pub(crate) fn addr_at(b: &[u8], off: usize) -> IpAddr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + ADDR_SIZE]);
    if a[..10] == [0; 10] && a[10] == 0xff && a[11] == 0xff {
        return IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]));
    }
    IpAddr::V6(Ipv6Addr::from(a))
}

/// A read-only view of one service record.
#[derive(Clone, Copy)]
pub struct Service<'b> {
    buf: &'b [u8],
    off: usize,
    ep: usize, // endpoint record size
}

impl<'b> Service<'b> {
    pub(crate) fn new(buf: &'b [u8], off: usize, ep: usize) -> Service<'b> {
        Service { buf, off, ep }
    }

    fn shape(&self) -> Shape {
        Shape::at(self.buf, self.off)
    }

    /// Returns the service's namespace.
    pub fn namespace(&self) -> &'b str {
        str_at(self.buf, self.off + S_NAMESPACE)
    }

    /// Returns the service's name.
    pub fn name(&self) -> &'b str {
        str_at(self.buf, self.off + S_NAME)
    }

    /// Returns the service port's name, possibly empty.
    pub fn port_name(&self) -> &'b str {
        str_at(self.buf, self.off + S_PORT_NAME)
    }

    /// Returns the port's protocol, or None for an unknown code.
    pub fn protocol(&self) -> Option<Protocol> {
        Protocol::from_code(self.buf[self.off + S_PROTOCOL])
    }

    /// Returns the service port's key as Weir prints it: namespace/name:port/protocol.
    pub fn key(&self) -> String {
        let protocol = self.protocol().map_or("", Protocol::name);
        format!(
            "{}/{}:{}/{}",
            self.namespace(),
            self.name(),
            self.port_name(),
            protocol
        )
    }

    /// Returns the service port.
    pub fn port(&self) -> u16 {
        u16_at(self.buf, self.off + S_PORT)
    }

    /// Returns the node port, 0 if none.
    pub fn node_port(&self) -> u16 {
        u16_at(self.buf, self.off + S_NODE_PORT)
    }

    /// Returns the health-check node port, 0 if none.
    pub fn health_check_node_port(&self) -> u16 {
        u16_at(self.buf, self.off + S_HEALTH_PORT)
    }

    /// Returns the raw service flags (bit 0 external Local, bit 1 internal Local).
    pub fn flags(&self) -> u16 {
        u16_at(self.buf, self.off + S_FLAGS)
    }

    /// Reports externalTrafficPolicy: Local.
    pub fn external_local(&self) -> bool {
        self.flags() & 1 != 0
    }

    /// Reports internalTrafficPolicy: Local.
    pub fn internal_local(&self) -> bool {
        self.flags() & 2 != 0
    }

    /// Returns the ClientIP affinity timeout in seconds; 0 = none.
    pub fn affinity_seconds(&self) -> u32 {
        u32_at(self.buf, self.off + S_AFFINITY)
    }

    /// Returns the scheduler hint's ABI code.
    pub fn scheduler_code(&self) -> u8 {
        self.buf[self.off + S_SCHEDULER]
    }

    /// Returns the scheduler hint; the default for an unknown code.
    pub fn scheduler(&self) -> Scheduler {
        Scheduler::from_code(self.scheduler_code()).unwrap_or(Scheduler::Default)
    }

    fn addrs(&self, from: usize, n: usize) -> Vec<IpAddr> {
        let p = self.off + SERVICE_HEADER_SIZE + ADDR_SIZE * from;
        (0..n)
            .map(|i| addr_at(self.buf, p + ADDR_SIZE * i))
            .collect()
    }

    /// Returns the service's cluster IPs.
    pub fn cluster_ips(&self) -> Vec<IpAddr> {
        self.addrs(0, self.shape().cluster_ips)
    }

    /// Returns the service's external IPs.
    pub fn external_ips(&self) -> Vec<IpAddr> {
        let sh = self.shape();
        self.addrs(sh.cluster_ips, sh.external_ips)
    }

    /// Returns the load-balancer IPs this node captures.
    pub fn load_balancer_ips(&self) -> Vec<IpAddr> {
        let sh = self.shape();
        self.addrs(sh.cluster_ips + sh.external_ips, sh.lb_ips)
    }

    /// Returns the ranges allowed to reach the load-balancer IPs.
    pub fn source_ranges(&self) -> Vec<SourceRange> {
        let sh = self.shape();
        let p = self.off + sh.ranges_off();
        (0..sh.ranges)
            .map(|i| {
                let at = p + RANGE_SIZE * i;
                SourceRange {
                    addr: addr_at(self.buf, at),
                    bits: self.buf[at + ADDR_SIZE],
                }
            })
            .collect()
    }

    /// Returns the labels as (key, value) pairs, sorted bytewise by key.
    pub fn labels(&self) -> Pairs<'b> {
        let sh = self.shape();
        Pairs {
            buf: self.buf,
            at: self.off + sh.pairs_off(),
            left: sh.labels,
        }
    }

    /// Returns the annotations as (key, value) pairs, sorted bytewise by key.
    pub fn annotations(&self) -> Pairs<'b> {
        let sh = self.shape();
        let at = self.off + sh.pairs_off() + PAIR_SIZE * sh.labels;
        Pairs {
            buf: self.buf,
            at,
            left: sh.annotations,
        }
    }

    /// Returns the value of label `key`.
    pub fn label(&self, key: &str) -> Option<&'b str> {
        self.labels().find_sorted(key)
    }

    /// Returns the value of annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&'b str> {
        self.annotations().find_sorted(key)
    }

    /// Returns the number of endpoints.
    pub fn len(&self) -> usize {
        u32_at(self.buf, self.off + S_ENDPOINTS) as usize
    }

    /// Reports whether the service has no endpoints.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Returns a view of endpoint slot `i`; it panics when `i` is out of range.
    #[track_caller]
    pub fn endpoint(&self, i: usize) -> Endpoint<'b> {
        Endpoint::new(self.buf, slot(self.buf, self.off, self.ep, i), self.ep)
    }

    /// Returns the endpoints in slot order.
    pub fn endpoints(&self) -> impl Iterator<Item = Endpoint<'b>> + 'b {
        let s = *self;
        (0..s.len()).map(move |i| s.endpoint(i))
    }
}

/// Returns the offset of endpoint slot `i` of the record at `off`, whose
/// endpoint records are `ep` bytes; it panics when `i` is out of range.
#[track_caller]
fn slot(buf: &[u8], off: usize, ep: usize, i: usize) -> usize {
    let n = u32_at(buf, off + S_ENDPOINTS) as usize;
    if i >= n {
        panic!("weir: endpoint index {i} out of range [0,{n})");
    }
    off + u32_at(buf, off + S_ENDPOINTS_OFF) as usize + ep * i
}

/// An iterator over a service's labels or annotations.
#[derive(Clone)]
pub struct Pairs<'b> {
    buf: &'b [u8],
    at: usize,
    left: usize,
}

impl<'b> Pairs<'b> {
    fn key(&self, i: usize) -> &'b [u8] {
        str_bytes(self.buf, self.at + PAIR_SIZE * i).unwrap_or(&[])
    }

    /// Binary-searches the key-sorted pairs for `key`.
    fn find_sorted(&self, key: &str) -> Option<&'b str> {
        let (mut lo, mut hi) = (0, self.left);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).cmp(key.as_bytes()) {
                Ordering::Less => lo = mid + 1,
                Ordering::Greater => hi = mid,
                Ordering::Equal => {
                    return Some(str_at(self.buf, self.at + PAIR_SIZE * mid + STR_SIZE))
                }
            }
        }
        None
    }
}

impl<'b> Iterator for Pairs<'b> {
    type Item = (&'b str, &'b str);

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let pair = (
            str_at(self.buf, self.at),
            str_at(self.buf, self.at + STR_SIZE),
        );
        self.at += PAIR_SIZE;
        self.left -= 1;
        Some(pair)
    }
}

/// An editable view of one service record: what a plugin may change.
pub struct ServiceMut<'b> {
    buf: &'b mut [u8],
    off: usize,
    ep: usize, // endpoint record size
}

impl<'b> ServiceMut<'b> {
    pub(crate) fn new(buf: &'b mut [u8], off: usize, ep: usize) -> ServiceMut<'b> {
        ServiceMut { buf, off, ep }
    }

    /// Returns a read-only view of the service.
    pub fn view(&self) -> Service<'_> {
        Service::new(self.buf, self.off, self.ep)
    }

    /// Returns the offset of endpoint slot `i`; it panics when `i` is out of range.
    #[track_caller]
    fn slot(&self, i: usize) -> usize {
        slot(self.buf, self.off, self.ep, i)
    }

    /// Returns the number of endpoints.
    pub fn len(&self) -> usize {
        self.view().len()
    }

    /// Reports whether the service has no endpoints.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets the affinity timeout; 0 clears it; values above 86400 are clamped.
    pub fn set_affinity(&mut self, seconds: u32) {
        put_u32(
            self.buf,
            self.off + S_AFFINITY,
            seconds.min(MAX_AFFINITY_SECONDS),
        );
    }

    /// Sets the scheduler hint.
    pub fn set_scheduler(&mut self, s: Scheduler) {
        self.buf[self.off + S_SCHEDULER] = s as u8;
    }

    /// Sets the weight of the endpoint in slot `i`; 0 drains it. It panics when `i` is out of range.
    #[track_caller]
    pub fn set_weight(&mut self, i: usize, weight: u32) {
        let at = self.slot(i);
        put_u32(self.buf, at + E_WEIGHT, weight);
    }

    /// Exchanges the endpoints in slots `i` and `j` (whole records, with
    /// their signals).
    #[track_caller]
    pub fn swap(&mut self, i: usize, j: usize) {
        let (a, b, ep) = (self.slot(i), self.slot(j), self.ep);
        if a == b {
            return;
        }
        let mut tmp = [0u8; ENDPOINT_SIZE_V2];
        let tmp = &mut tmp[..ep];
        tmp.copy_from_slice(&self.buf[a..a + ep]);
        self.buf.copy_within(b..b + ep, a);
        self.buf[b..b + ep].copy_from_slice(tmp);
    }

    /// Drops the endpoints `keep` rejects, preserving order, and returns the new count.
    ///
    /// Each kept record is copied to the first free slot; the slots after
    /// the new count keep their old bytes (the Go SDK does the same, so both
    /// write the same output).
    pub fn keep<F: FnMut(&Endpoint<'_>) -> bool>(&mut self, mut keep: F) -> usize {
        let n = self.len();
        let mut w = 0;
        for i in 0..n {
            let from = self.slot(i);
            if !keep(&Endpoint::new(self.buf, from, self.ep)) {
                continue;
            }
            if w != i {
                let to = self.slot(w);
                self.buf.copy_within(from..from + self.ep, to);
            }
            w += 1;
        }
        put_u32(self.buf, self.off + S_ENDPOINTS, w as u32);
        w
    }

    /// Sorts the endpoints by `cmp`, keeping equal ones in their order.
    pub fn sort_endpoints_by<F>(&mut self, mut cmp: F)
    where
        F: FnMut(&Endpoint<'_>, &Endpoint<'_>) -> Ordering,
    {
        let n = self.len();
        if n < 2 {
            return;
        }
        let (first, ep) = (self.slot(0), self.ep);
        let orig = self.buf[first..first + ep * n].to_vec();
        let mut order: Vec<usize> = (0..n).collect();
        {
            let buf: &[u8] = self.buf;
            let view = |k: usize| Endpoint::with_record(buf, &orig[ep * k..ep * (k + 1)]);
            order.sort_by(|&a, &b| cmp(&view(a), &view(b)));
        }
        for (to, from) in order.into_iter().enumerate() {
            let dst = first + ep * to;
            self.buf[dst..dst + ep].copy_from_slice(&orig[ep * from..ep * (from + 1)]);
        }
    }
}
