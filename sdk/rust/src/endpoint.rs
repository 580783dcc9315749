//! The view of one endpoint record.

use std::net::IpAddr;

use crate::layout::*;
use crate::service::addr_at;

/// Endpoint flag: ready.
pub const READY: u16 = 1;
/// Endpoint flag: serving.
pub const SERVING: u16 = 2;
/// Endpoint flag: terminating.
pub const TERMINATING: u16 = 4;
/// Endpoint flag: on this node.
pub const LOCAL: u16 = 8;
/// Endpoint flag: the planner sends Cluster-policy traffic to it.
pub const FOR_CLUSTER: u16 = 16;
/// Endpoint flag: the planner sends Local-policy traffic to it.
pub const FOR_LOCAL: u16 = 32;

/// A read-only view of one endpoint record; edit endpoints through `ServiceMut`.
#[derive(Clone, Copy)]
pub struct Endpoint<'b> {
    buf: &'b [u8], // the batch, for strings
    rec: &'b [u8], // the record: 52 bytes, or 60 in version 2
}

impl<'b> Endpoint<'b> {
    /// Returns a view of the record of `ep` bytes at `at`.
    pub(crate) fn new(buf: &'b [u8], at: usize, ep: usize) -> Endpoint<'b> {
        Endpoint {
            buf,
            rec: &buf[at..at + ep],
        }
    }

    pub(crate) fn with_record(buf: &'b [u8], rec: &'b [u8]) -> Endpoint<'b> {
        Endpoint { buf, rec }
    }

    /// Returns the endpoint's index in the batch Weir sent.
    pub fn id(&self) -> u32 {
        u32_at(self.rec, E_ID)
    }

    /// Returns the endpoint's address; IPv4-mapped addresses come back as IPv4.
    pub fn address(&self) -> IpAddr {
        addr_at(self.rec, 0)
    }

    /// Returns the endpoint's port.
    pub fn port(&self) -> u16 {
        u16_at(self.rec, E_PORT)
    }

    /// Returns the raw flags (READY, SERVING, ...).
    pub fn flags(&self) -> u16 {
        u16_at(self.rec, E_FLAGS)
    }

    /// Reports whether the endpoint is ready.
    pub fn ready(&self) -> bool {
        self.flags() & READY != 0
    }

    /// Reports whether the endpoint is serving.
    pub fn serving(&self) -> bool {
        self.flags() & SERVING != 0
    }

    /// Reports whether the endpoint's pod is shutting down.
    pub fn terminating(&self) -> bool {
        self.flags() & TERMINATING != 0
    }

    /// Reports whether the endpoint runs on this node.
    pub fn local(&self) -> bool {
        self.flags() & LOCAL != 0
    }

    /// Reports whether the endpoint serves Cluster-policy traffic.
    pub fn for_cluster(&self) -> bool {
        self.flags() & FOR_CLUSTER != 0
    }

    /// Reports whether the endpoint serves Local-policy traffic.
    pub fn for_local(&self) -> bool {
        self.flags() & FOR_LOCAL != 0
    }

    /// Returns the endpoint's share of new connections; 0 drains.
    pub fn weight(&self) -> u32 {
        u32_at(self.rec, E_WEIGHT)
    }

    /// Returns the number of connections open to the endpoint through
    /// Weir's rules on this node when the batch carries signals (version
    /// 2), else 0.
    pub fn active(&self) -> u32 {
        self.signal(E_ACTIVE)
    }

    /// Returns the number of connections opened to the endpoint since the
    /// previous reading of the signals (0 at the first reading) when the
    /// batch carries signals (version 2), else 0.
    pub fn new_connections(&self) -> u32 {
        self.signal(E_NEW)
    }

    fn signal(&self, field: usize) -> u32 {
        if self.rec.len() < ENDPOINT_SIZE_V2 {
            return 0;
        }
        u32_at(self.rec, field)
    }

    fn string(&self, field: usize) -> &'b str {
        let (o, n) = (
            u32_at(self.rec, field) as usize,
            u32_at(self.rec, field + 4) as usize,
        );
        if n == 0 {
            return "";
        }
        o.checked_add(n)
            .and_then(|end| self.buf.get(o..end))
            .and_then(|s| std::str::from_utf8(s).ok())
            .unwrap_or("")
    }

    /// Returns the name of the endpoint's node, or "".
    pub fn node_name(&self) -> &'b str {
        self.string(E_NODE)
    }

    /// Returns the endpoint's zone, or "".
    pub fn zone(&self) -> &'b str {
        self.string(E_ZONE)
    }

    /// Returns the endpoint's pod name, or "".
    pub fn pod(&self) -> &'b str {
        self.string(E_POD)
    }
}
