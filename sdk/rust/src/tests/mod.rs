//! Tests of the SDK against the ABI's shared test vectors
//! (sdk/abi/testdata/vectors, made by the Go SDK) and of the guest runtime.

mod guest;
mod json;

use std::cmp::Ordering;
use std::net::IpAddr;
use std::path::PathBuf;

use self::json::Json;
use crate::{Batch, Endpoint, Scheduler, Service, SourceRange, ENDPOINT_SIZE_V2, VERSION_2};

/// Returns the vectors directory: $WEIR_VECTORS, else found from the crate
/// (under cargo) or from the repository's root (rustc --test run there).
fn vectors_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WEIR_VECTORS") {
        return PathBuf::from(dir);
    }
    match option_env!("CARGO_MANIFEST_DIR") {
        Some(crate_dir) => PathBuf::from(crate_dir).join("../abi/testdata/vectors"),
        None => PathBuf::from("sdk/abi/testdata/vectors"),
    }
}

fn read(name: &str) -> Vec<u8> {
    let path = vectors_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (set WEIR_VECTORS)", path.display()))
}

fn read_json(name: &str) -> Json {
    Json::parse(&String::from_utf8(read(name)).expect("vector JSON is UTF-8"))
}

/// Returns the names index.json lists under `kind` ("batches" or "outputs").
fn names(kind: &str) -> Vec<String> {
    let index = read_json("index.json");
    let names: Vec<String> = index
        .get(kind)
        .arr()
        .iter()
        .map(|n| n.str().to_string())
        .collect();
    assert!(!names.is_empty(), "index.json lists no {kind}");
    names
}

#[test]
fn decodes_every_batch() {
    for name in names("batches") {
        let mut buf = read(&format!("batches/{name}.bin"));
        let want = read_json(&format!("batches/{name}.json"));
        assert_eq!(buf.len() as u64, want.get("size").u64(), "{name}: size");
        let batch = Batch::parse(&mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_batch(&name, &batch, &want);
    }
}

fn check_batch(name: &str, b: &Batch<'_>, want: &Json) {
    assert_eq!(
        u64::from(b.version()),
        want.get("version").u64(),
        "{name}: version"
    );
    assert_eq!(
        b.node_name(),
        want.get("node").get("name").str(),
        "{name}: node name"
    );
    assert_eq!(
        b.node_zone(),
        want.get("node").get("zone").str(),
        "{name}: node zone"
    );
    assert_eq!(b.full(), want.get("full").bool(), "{name}: full");
    let services = want.get("services").arr();
    assert_eq!(b.len(), services.len(), "{name}: number of services");
    for (i, w) in services.iter().enumerate() {
        check_service(&format!("{name}: service {i}"), b.service(i), w);
    }
}

fn check_service(at: &str, s: Service<'_>, w: &Json) {
    assert_eq!(s.namespace(), w.get("namespace").str(), "{at}: namespace");
    assert_eq!(s.name(), w.get("name").str(), "{at}: name");
    assert_eq!(s.port_name(), w.get("portName").str(), "{at}: port name");
    let protocol = s.protocol().map_or("", |p| p.name());
    assert_eq!(protocol, w.get("protocol").str(), "{at}: protocol");
    assert_eq!(
        s.scheduler().name(),
        w.get("scheduler").str(),
        "{at}: scheduler"
    );
    assert_eq!(
        u64::from(s.scheduler_code()),
        w.get("schedulerCode").u64(),
        "{at}: scheduler code"
    );
    assert_eq!(u64::from(s.flags()), w.get("flags").u64(), "{at}: flags");
    assert_eq!(
        s.external_local(),
        w.get("externalLocal").bool(),
        "{at}: externalLocal"
    );
    assert_eq!(
        s.internal_local(),
        w.get("internalLocal").bool(),
        "{at}: internalLocal"
    );
    assert_eq!(u64::from(s.port()), w.get("port").u64(), "{at}: port");
    assert_eq!(
        u64::from(s.node_port()),
        w.get("nodePort").u64(),
        "{at}: node port"
    );
    assert_eq!(
        u64::from(s.health_check_node_port()),
        w.get("healthCheckNodePort").u64(),
        "{at}: health-check port"
    );
    assert_eq!(
        u64::from(s.affinity_seconds()),
        w.get("affinitySeconds").u64(),
        "{at}: affinity"
    );
    assert_eq!(
        s.cluster_ips(),
        ips(w.get("clusterIPs")),
        "{at}: cluster IPs"
    );
    assert_eq!(
        s.external_ips(),
        ips(w.get("externalIPs")),
        "{at}: external IPs"
    );
    assert_eq!(
        s.load_balancer_ips(),
        ips(w.get("loadBalancerIPs")),
        "{at}: load-balancer IPs"
    );
    assert_eq!(
        s.source_ranges(),
        ranges(w.get("sourceRanges")),
        "{at}: source ranges"
    );
    check_pairs(at, "labels", s.labels().collect(), w.get("labels"), |k| {
        s.label(k)
    });
    check_pairs(
        at,
        "annotations",
        s.annotations().collect(),
        w.get("annotations"),
        |k| s.annotation(k),
    );
    let eps = w.get("endpoints").arr();
    assert_eq!(s.len(), eps.len(), "{at}: number of endpoints");
    for (j, (e, we)) in s.endpoints().zip(eps).enumerate() {
        check_endpoint(&format!("{at}: endpoint {j}"), &e, we);
    }
}

fn check_pairs<'a, F>(at: &str, what: &str, got: Vec<(&'a str, &'a str)>, want: &Json, lookup: F)
where
    F: Fn(&str) -> Option<&'a str>,
{
    let want: Vec<(&str, &str)> = want
        .arr()
        .iter()
        .map(|p| (p.get("key").str(), p.get("value").str()))
        .collect();
    assert_eq!(got, want, "{at}: {what}");
    for (k, v) in want {
        assert_eq!(lookup(k), Some(v), "{at}: {what} lookup of {k:?}");
        assert_eq!(
            lookup(&format!("{k}\u{0}")),
            None,
            "{at}: {what} lookup of a missing key"
        );
    }
}

fn check_endpoint(at: &str, e: &Endpoint<'_>, w: &Json) {
    assert_eq!(u64::from(e.id()), w.get("id").u64(), "{at}: id");
    assert_eq!(e.address(), ip(w.get("address")), "{at}: address");
    assert_eq!(u64::from(e.port()), w.get("port").u64(), "{at}: port");
    assert_eq!(u64::from(e.flags()), w.get("flags").u64(), "{at}: flags");
    let flags = [
        (e.ready(), "ready"),
        (e.serving(), "serving"),
        (e.terminating(), "terminating"),
        (e.local(), "local"),
        (e.for_cluster(), "forCluster"),
        (e.for_local(), "forLocal"),
    ];
    for (got, key) in flags {
        assert_eq!(got, w.get(key).bool(), "{at}: {key}");
    }
    assert_eq!(u64::from(e.weight()), w.get("weight").u64(), "{at}: weight");
    assert_eq!(e.node_name(), w.get("nodeName").str(), "{at}: node name");
    assert_eq!(e.zone(), w.get("zone").str(), "{at}: zone");
    assert_eq!(e.pod(), w.get("pod").str(), "{at}: pod");
    assert_eq!(u64::from(e.active()), w.get("active").u64(), "{at}: active");
    assert_eq!(
        u64::from(e.new_connections()),
        w.get("new").u64(),
        "{at}: new connections"
    );
}

fn ip(j: &Json) -> IpAddr {
    j.str().parse().unwrap_or_else(|e| panic!("{j:?}: {e}"))
}

fn ips(j: &Json) -> Vec<IpAddr> {
    j.arr().iter().map(ip).collect()
}

fn ranges(j: &Json) -> Vec<SourceRange> {
    j.arr()
        .iter()
        .map(|r| {
            let (addr, bits) = r.str().split_once('/').expect("a range has a /");
            SourceRange {
                addr: addr.parse().unwrap(),
                bits: bits.parse().unwrap(),
            }
        })
        .collect()
}

#[test]
fn hex_dumps_match_batches() {
    let mut checked = 0;
    for name in names("batches") {
        let path = vectors_dir().join(format!("batches/{name}.hex"));
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(_) => continue, // large batches have no dump
        };
        assert_eq!(
            unhex(&text),
            read(&format!("batches/{name}.bin")),
            "{name}.hex"
        );
        checked += 1;
    }
    assert!(checked > 0, "no .hex dump found");
}

/// Reads the bytes back from a `hexdump -C` listing.
fn unhex(text: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in text.lines() {
        let body = line.split('|').next().unwrap_or("");
        for word in body.split_whitespace().skip(1) {
            out.push(u8::from_str_radix(word, 16).expect("a hex byte"));
        }
    }
    out
}

#[test]
fn makes_every_output() {
    for name in names("outputs") {
        let want = read_json(&format!("outputs/{name}.json"));
        let input = want.get("input").str();
        let mut buf = read(&format!("batches/{input}.bin"));
        {
            let mut batch = Batch::parse(&mut buf).unwrap();
            for e in want.get("edits").arr() {
                apply(&mut batch, e);
            }
            check_result(&name, &batch, want.get("result"));
            let sent = read_json(&format!("batches/{input}.json"));
            check_signals_travel(&name, &batch, &sent);
        }
        assert!(
            buf == read(&format!("outputs/{name}.bin")),
            "{name}: the output's bytes differ from the vector's"
        );
    }
}

/// Makes one edit of an output vector through the SDK.
fn apply(b: &mut Batch<'_>, e: &Json) {
    let args: Vec<u32> = e.get("args").arr().iter().map(|a| a.u64() as u32).collect();
    let mut s = b.service_mut(e.get("service").u64() as usize);
    match e.get("op").str() {
        "setWeight" => s.set_weight(args[0] as usize, args[1]),
        "swap" => s.swap(args[0] as usize, args[1] as usize),
        "keep" => {
            s.keep(|ep| args.contains(&ep.id()));
        }
        "sortByWeightDesc" => s.sort_endpoints_by(|a, b| b.weight().cmp(&a.weight())),
        "setAffinity" => s.set_affinity(args[0]),
        "setScheduler" => {
            s.set_scheduler(Scheduler::from_code(args[0] as u8).expect("a known scheduler"))
        }
        op => panic!("unknown op {op:?}"),
    }
}

fn check_result(name: &str, b: &Batch<'_>, result: &Json) {
    for (i, r) in result.arr().iter().enumerate() {
        let s = b.service(i);
        assert_eq!(
            u64::from(s.affinity_seconds()),
            r.get("affinitySeconds").u64(),
            "{name}: service {i} affinity"
        );
        assert_eq!(
            s.scheduler().name(),
            r.get("scheduler").str(),
            "{name}: service {i} scheduler"
        );
        let got: Vec<(u64, u64)> = s
            .endpoints()
            .map(|e| (e.id().into(), e.weight().into()))
            .collect();
        let want: Vec<(u64, u64)> = r
            .get("endpoints")
            .arr()
            .iter()
            .map(|e| (e.get("id").u64(), e.get("weight").u64()))
            .collect();
        assert_eq!(got, want, "{name}: service {i} endpoints (id, weight)");
    }
}

/// Checks that every endpoint left in the edited batch has the signals its
/// id had in the batch sent: edits move whole records.
fn check_signals_travel(name: &str, b: &Batch<'_>, sent: &Json) {
    for (i, ws) in sent.get("services").arr().iter().enumerate() {
        let eps = ws.get("endpoints").arr();
        for e in b.service(i).endpoints() {
            let w = &eps[e.id() as usize];
            assert_eq!(w.get("id").u64(), u64::from(e.id()), "{name}: vector order");
            let got = (u64::from(e.active()), u64::from(e.new_connections()));
            let want = (w.get("active").u64(), w.get("new").u64());
            assert_eq!(
                got,
                want,
                "{name}: service {i} endpoint id {}: signals",
                e.id()
            );
        }
    }
}

#[test]
fn reads_both_versions() {
    let mut v1 = read("batches/simple.bin");
    let b = Batch::parse(&mut v1).unwrap();
    assert_eq!(b.version(), 1);
    let e = b.service(0).endpoint(0);
    assert_eq!(
        (e.active(), e.new_connections()),
        (0, 0),
        "version 1 signals"
    );

    let mut v2 = read("batches/signals.bin");
    let b = Batch::parse(&mut v2).unwrap();
    assert_eq!(b.version(), VERSION_2);
    // The same service as in simple.bin, read through 60-byte records.
    let s = b.service(0);
    assert_eq!(s.endpoint(1).pod(), "web-2");
    let e = s.endpoint(0);
    assert_eq!((e.active(), e.new_connections()), (3, 1));
    let e = b.service(1).endpoint(2);
    assert_eq!((e.active(), e.new_connections()), (u32::MAX, u32::MAX));
    assert_eq!(e.pod(), "api-3");
}

#[test]
fn edits_keep_the_version_and_move_signals() {
    let mut buf = read("batches/signals.bin");
    let before = buf.clone();
    let mut batch = Batch::parse(&mut buf).unwrap();
    let mut s = batch.service_mut(1);
    s.swap(0, 2);
    s.keep(|e| e.id() != 1);
    s.sort_endpoints_by(|a, b| a.active().cmp(&b.active()));
    let view = s.view();
    let got: Vec<(u32, u32, u32)> = view
        .endpoints()
        .map(|e| (e.id(), e.active(), e.new_connections()))
        .collect();
    assert_eq!(got, [(0, 12, 4), (2, u32::MAX, u32::MAX)]);
    assert_eq!(batch.version(), VERSION_2);
    assert_eq!(batch.bytes()[..8], before[..8], "the header changed");
    // The first service, not edited, is untouched.
    let off = rec(&before, 0);
    let end = off + 64 + 16 + 2 * ENDPOINT_SIZE_V2;
    assert!(batch.bytes()[off..end] == before[off..end]);
}

#[test]
fn parse_rejects_malformed_batches() {
    let good = read("batches/every-field.bin");
    let cases: Vec<(&str, Mutation)> = vec![
        ("short", Box::new(|b| b.truncate(20))),
        ("magic", Box::new(|b| b[0] ^= 1)),
        ("version 0", Box::new(|b| b[4] = 0)),
        ("version 3", Box::new(|b| b[4] = 3)),
        // 60-byte records: the endpoint array no longer fits the record.
        ("version 1 read as 2", Box::new(|b| b[4] = 2)),
        (
            "record table",
            Box::new(|b| b[8..12].copy_from_slice(&0x4000_0000u32.to_le_bytes())),
        ),
        (
            "string area",
            Box::new(|b| b[12..16].copy_from_slice(&u32::MAX.to_le_bytes())),
        ),
        (
            "node name",
            Box::new(|b| b[20..24].copy_from_slice(&u32::MAX.to_le_bytes())),
        ),
        ("unaligned record", Box::new(|b| b[32] += 2)),
        (
            "overlapping records",
            Box::new(|b| {
                let first = b[32..36].to_vec();
                b[36..40].copy_from_slice(&first)
            }),
        ),
        (
            "endpoint count",
            Box::new(|b| {
                let r = rec(b, 0);
                b[r + 20..r + 24].copy_from_slice(&1000u32.to_le_bytes())
            }),
        ),
        (
            "endpoint array offset",
            Box::new(|b| {
                let r = rec(b, 0);
                b[r + 60..r + 64].copy_from_slice(&64u32.to_le_bytes())
            }),
        ),
        (
            "key string",
            Box::new(|b| {
                let r = rec(b, 1);
                b[r + 32..r + 36].copy_from_slice(&u32::MAX.to_le_bytes())
            }),
        ),
        (
            "label string",
            Box::new(|b| {
                let r = rec(b, 0);
                let p = r + 64 + 6 * 16 + 4 * 20;
                b[p + 4..p + 8].copy_from_slice(&u32::MAX.to_le_bytes())
            }),
        ),
    ];
    for (what, mutate) in cases {
        let mut buf = good.clone();
        mutate(&mut buf);
        assert!(
            Batch::parse(&mut buf).is_err(),
            "{what}: a malformed batch parsed"
        );
    }
}

/// A change that makes a good batch malformed.
type Mutation = Box<dyn Fn(&mut Vec<u8>)>;

/// Returns the offset of service i's record.
fn rec(b: &[u8], i: usize) -> usize {
    let at = 32 + 4 * i;
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
}

#[test]
fn endpoint_string_outside_reads_empty() {
    let mut buf = read("batches/simple.bin");
    let r = rec(&buf, 0);
    let pod = r + 64 + 16 + 44;
    buf[pod..pod + 4].copy_from_slice(&(u32::MAX - 2).to_le_bytes());
    let batch = Batch::parse(&mut buf).unwrap();
    assert_eq!(batch.service(0).endpoint(0).pod(), "");
    assert_eq!(batch.service(0).endpoint(0).node_name(), "node-a");
}

#[test]
fn sort_is_stable_and_swap_with_itself_is_a_no_op() {
    let mut buf = read("batches/many-endpoints.bin");
    let before = buf.clone();
    let mut batch = Batch::parse(&mut buf).unwrap();
    let mut s = batch.service_mut(0);
    s.swap(3, 3);
    s.sort_endpoints_by(|_, _| Ordering::Equal);
    assert!(
        batch.bytes() == &before[..],
        "an all-equal sort or a self-swap changed the batch"
    );
}

#[test]
#[should_panic(expected = "endpoint index 2 out of range [0,2)")]
fn endpoint_index_out_of_range_panics() {
    let mut buf = read("batches/simple.bin");
    let batch = Batch::parse(&mut buf).unwrap();
    batch.service(0).endpoint(2);
}
