// The AssemblyScript SDK of Weir hook plugins: typed views over the batch
// layout of docs/plugin-abi.md (ABI versions 1 and 2), read and edited in
// place in linear memory, and the bodies of the exports Weir calls.
//
// It speaks version 2 (weir_abi_version returns 2) and reads and edits
// batches of both versions alike: Weir sends version 1 batches unless the
// plugin's configuration asks for signals (signals: [connections]), and then
// version 2 batches, whose 60-byte endpoint records carry each endpoint's
// active and new connection counts (Endpoint.active, .newConnections; 0 in
// a version 1 batch). Edits move whole records, signals included.
//
// A plugin re-exports weir_abi_version, weir_alloc and weir_free from here
// and defines weir_process with process(); see plugins/as-same-zone.

// The batch header's first word, the bytes "WEIR".
export const MAGIC: u32 = 0x52494557;
// ABI version 1: no signals, 52-byte endpoint records.
export const VERSION_1: u16 = 1;
// ABI version 2: each endpoint's live signals, 60-byte endpoint records
// (version 1's 52 bytes, then the active and new connection counts).
export const VERSION_2: u16 = 2;
// The newest ABI version this SDK speaks, returned by weir_abi_version; it
// reads and edits batches of versions 1 and 2.
export const ABI_VERSION: i32 = VERSION_2;
// The size of an endpoint record in version 1.
export const ENDPOINT_SIZE: usize = 52;
// The size of an endpoint record in version 2.
export const ENDPOINT_SIZE_V2: usize = 60;
// The longest affinity timeout a plugin may set, in seconds.
export const MAX_AFFINITY_SECONDS: u32 = 86400;

const HEADER_SIZE: usize = 32;
const SERVICE_HEADER_SIZE: usize = 64;
const ADDR_SIZE: usize = 16;
const RANGE_SIZE: usize = 20;
const PAIR_SIZE: usize = 16;
const STR_SIZE: usize = 8;

// Call statuses, as docs/plugin-abi.md numbers them.
export namespace Status {
  export const OK: u32 = 0;
  export const BadInput: u32 = 1;
  export const Panic: u32 = 2;
  export const Failed: u32 = 3;
  export const BadConfig: u32 = 4;
}

// Endpoint flag bits.
export namespace Flags {
  export const READY: u16 = 1;
  export const SERVING: u16 = 2;
  export const TERMINATING: u16 = 4;
  export const LOCAL: u16 = 8;
  export const FOR_CLUSTER: u16 = 16;
  export const FOR_LOCAL: u16 = 32;
}

// Scheduler names, indexed by their ABI code.
export const SCHEDULERS: string[] = ["", "rr", "wrr", "lc", "wlc", "sh", "mh"];

@external("wasi_snapshot_preview1", "fd_write")
declare function fd_write(fd: u32, iovs: usize, iovsLen: u32, written: usize): u16;

// Writes one line to stderr (Weir's log) in a single write.
export function log(line: string): void {
  const text = String.UTF8.encode(line + "\n");
  const iov = heap.alloc(12);
  store<u32>(iov, changetype<usize>(text));
  store<u32>(iov, text.byteLength, 4);
  fd_write(2, iov, 1, iov + 8);
  heap.free(iov);
}

// The export running, for abort's line.
let running = "weir";

// Logs an abort (a failed assertion, an index out of range, a throw) with
// its location, then traps. Build with --use abort=<path>/abort so that the
// module imports nothing but WASI.
export function abort(message: string | null, file: string | null, line: u32, column: u32): void {
  const where = file === null ? "?" : file;
  const what = message === null ? "abort" : message;
  log(running + ": panic at " + where + ":" + line.toString() + ":" + column.toString() + ": " + what);
  unreachable();
}

// Returns the ABI version; re-export it as weir_abi_version.
export function weir_abi_version(): i32 {
  return ABI_VERSION;
}

// Returns size writable bytes aligned to 16, outside the garbage collector's
// reach, or 0; re-export it as weir_alloc.
export function weir_alloc(size: u32): usize {
  return heap.alloc(<usize>max<u32>(size, 1));
}

// Releases a block from weir_alloc; re-export it as weir_free.
export function weir_free(ptr: usize): void {
  if (ptr != 0) heap.free(ptr);
}

// Parses the batch at ptr, runs fn on it and returns weir_process's result:
// ptr << 32 | len (the batch edited in place), or a status. fn returns null
// on success or the reason it refuses the batch.
export function process(ptr: usize, len: u32, fn: (b: Batch) => string | null): u64 {
  running = "weir_process";
  const result = processBatch(ptr, len, fn);
  running = "weir";
  return result;
}

function processBatch(ptr: usize, len: u32, fn: (b: Batch) => string | null): u64 {
  const b = Batch.parse(ptr, len);
  if (b === null) {
    log("weir_process: bad batch: " + Batch.lastError);
    return Status.BadInput;
  }
  const err = fn(b);
  if (err !== null) {
    log("weir_process: " + err);
    return Status.Failed;
  }
  return (<u64>ptr << 32) | <u64>len;
}

// Decodes the UTF-8 configuration at ptr, runs fn on it and returns
// weir_configure's status: OK, or BadConfig with fn's reason logged. fn
// receives the JSON text ("null" when the plugin has no config) and returns
// null to accept it.
export function configure(ptr: usize, len: u32, fn: (config: string) => string | null): u32 {
  running = "weir_configure";
  const err = fn(String.UTF8.decodeUnsafe(ptr, len));
  running = "weir";
  if (err === null) return Status.OK;
  log(err);
  return Status.BadConfig;
}

// Reports whether the UTF-8 configuration at ptr is empty or JSON null.
export function isNullConfig(ptr: usize, len: u32): bool {
  const text = String.UTF8.decodeUnsafe(ptr, len).trim();
  return text.length == 0 || text == "null";
}

function u16at(p: usize): usize {
  return <usize>load<u16>(p);
}

// A string descriptor at p inside a batch of len bytes at base: whether it lies inside.
function strFits(base: usize, len: u32, p: usize): bool {
  const o = <u64>load<u32>(p);
  const n = <u64>load<u32>(p, 4);
  return n == 0 || o + n <= <u64>len;
}

// Decodes the string whose descriptor is at p; "" when outside the batch.
function strAt(base: usize, len: u32, p: usize): string {
  if (!strFits(base, len, p)) return "";
  const n = load<u32>(p, 4);
  if (n == 0) return "";
  return String.UTF8.decodeUnsafe(base + <usize>load<u32>(p), n);
}

// Compares the bytes of the string described at p with the UTF-8 bytes of key.
function compareKey(base: usize, p: usize, key: ArrayBuffer): i32 {
  const n = load<u32>(p, 4);
  const k = <u32>key.byteLength;
  const common = min(n, k);
  const c = memory.compare(base + <usize>load<u32>(p), changetype<usize>(key), common);
  if (c != 0) return c;
  return <i32>n - <i32>k;
}

// Returns the size of an endpoint record in batch layout version v, or 0
// for a version this SDK does not read.
function endpointSize(v: u16): usize {
  return v == VERSION_1 ? ENDPOINT_SIZE : v == VERSION_2 ? ENDPOINT_SIZE_V2 : 0;
}

// One batch in linear memory, read and edited in place.
export class Batch {
  // Why the last parse failed.
  static lastError: string = "";

  // endpointSize is the size of its endpoint records: 52, or 60 in version 2.
  constructor(readonly base: usize, readonly size: u32, readonly count: u32, readonly endpointSize: usize) {}

  // Checks the batch of len bytes at ptr (of version 1 or 2); null (and
  // lastError) when it is malformed.
  static parse(ptr: usize, len: u32): Batch | null {
    const err = check(ptr, len);
    if (err !== null) {
      Batch.lastError = err;
      return null;
    }
    return new Batch(ptr, len, load<u32>(ptr, 8), endpointSize(load<u16>(ptr, 4)));
  }

  // Returns the batch's layout version: 1, or 2 when it carries signals.
  version(): u16 {
    return load<u16>(this.base, 4);
  }

  // Reports whether the batch holds every service the plugin matches.
  get full(): bool {
    return (load<u16>(this.base, 6) & 1) != 0;
  }

  // Returns the name of the node Weir runs on.
  nodeName(): string {
    return strAt(this.base, this.size, this.base + 16);
  }

  // Returns the node's zone, or "".
  nodeZone(): string {
    return strAt(this.base, this.size, this.base + 24);
  }

  // Returns the number of services.
  get length(): i32 {
    return <i32>this.count;
  }

  // Returns a view of service i; it aborts when i is out of range.
  service(i: i32): Service {
    assert(i >= 0 && <u32>i < this.count, "service index out of range");
    return new Service(this, this.base + <usize>load<u32>(this.base + HEADER_SIZE + 4 * <usize>i));
  }
}

// Validates a batch's bounds as the Go SDK does; null when it is fine.
function check(base: usize, len: u32): string | null {
  if (<usize>len < HEADER_SIZE) return "batch of " + len.toString() + " bytes is shorter than its header";
  if (load<u32>(base) != MAGIC) return "bad magic 0x" + load<u32>(base).toString(16);
  const ep = endpointSize(load<u16>(base, 4));
  if (ep == 0) return "batch version " + load<u16>(base, 4).toString() + ", want 1 or 2";
  const n = <u64>load<u32>(base, 8);
  if (<u64>HEADER_SIZE + 4 * n > <u64>len) return "record table of " + n.toString() + " services is outside the batch";
  if (load<u32>(base, 12) > len) return "string area offset is outside the batch";
  if (!strFits(base, len, base + 16) || !strFits(base, len, base + 24)) return "node name or zone is outside the batch";
  let end = <u64>HEADER_SIZE + 4 * n;
  for (let i: u64 = 0; i < n; i++) {
    const off = <u64>load<u32>(base + HEADER_SIZE + 4 * <usize>i);
    if (off < end) return "service " + i.toString() + ": record offset overlaps the record table or the previous record";
    const err = checkRecord(base, len, off, ep);
    if (err !== null) return "service " + i.toString() + ": " + err;
    end = off + <u64>load<u32>(base + <usize>off);
  }
  return null;
}

// Checks one record's bounds, with endpoint records of ep bytes; null when it is fine.
function checkRecord(base: usize, len: u32, off: u64, ep: usize): string | null {
  if (off % 4 != 0) return "record offset " + off.toString() + " is not a multiple of 4";
  if (off + SERVICE_HEADER_SIZE > <u64>len) return "record offset " + off.toString() + " is outside the batch";
  const r = base + <usize>off;
  const size = <u64>load<u32>(r);
  if (off + size > <u64>len) return "record size " + size.toString() + " goes past the batch's end";
  const pairsOff = pairsOffset(r);
  const minEndpoints = pairsOff + PAIR_SIZE * (u16at(r + 56) + u16at(r + 58));
  const eoff = <u64>load<u32>(r, 60);
  if (eoff < <u64>minEndpoints || eoff % 4 != 0) return "endpoint array offset overlaps the arrays before it or is unaligned";
  if (eoff + <u64>ep * <u64>load<u32>(r, 20) > size) return "endpoint array goes past the record's size";
  for (let f: usize = 24; f < 48; f += STR_SIZE) {
    if (!strFits(base, len, r + f)) return "key string is outside the batch";
  }
  for (let p = r + pairsOff; p < r + minEndpoints; p += STR_SIZE) {
    if (!strFits(base, len, p)) return "label or annotation string is outside the batch";
  }
  return null;
}

// Returns the offset of the labels from the start of the record at r.
function pairsOffset(r: usize): usize {
  const addrs = u16at(r + 48) + u16at(r + 50) + u16at(r + 52);
  return SERVICE_HEADER_SIZE + ADDR_SIZE * addrs + RANGE_SIZE * u16at(r + 54);
}

// Formats the 16-byte address at p: IPv4-mapped as dotted IPv4, others as RFC 5952 text.
export function addressText(p: usize): string {
  let mapped = load<u16>(p + 10) == 0xffff;
  for (let i: usize = 0; i < 10 && mapped; i++) mapped = load<u8>(p + i) == 0;
  if (mapped) {
    return load<u8>(p + 12).toString() + "." + load<u8>(p + 13).toString() + "." +
      load<u8>(p + 14).toString() + "." + load<u8>(p + 15).toString();
  }
  const groups = new Array<u32>(8);
  for (let i = 0; i < 8; i++) groups[i] = (<u32>load<u8>(p + 2 * i) << 8) | load<u8>(p + 2 * i + 1);
  // The longest run of two or more zero groups, the first of equal ones, becomes "::".
  let best = -1, bestLen = 1;
  for (let i = 0; i < 8; ) {
    let j = i;
    while (j < 8 && groups[j] == 0) j++;
    if (j - i > bestLen) { best = i; bestLen = j - i; }
    i = j == i ? i + 1 : j;
  }
  let out = "";
  for (let i = 0; i < 8; i++) {
    if (i == best) {
      out += "::";
      i += bestLen - 1;
      continue;
    }
    if (out.length > 0 && !out.endsWith(":")) out += ":";
    out += groups[i].toString(16);
  }
  return out;
}

// A view of one service record.
export class Service {
  constructor(readonly batch: Batch, readonly rec: usize) {}

  private str(field: usize): string {
    return strAt(this.batch.base, this.batch.size, this.rec + field);
  }

  // Returns the service's namespace.
  namespace(): string { return this.str(24); }
  // Returns the service's name.
  name(): string { return this.str(32); }
  // Returns the service port's name, possibly "".
  portName(): string { return this.str(40); }
  // Returns the protocol code: 1 TCP, 2 UDP, 3 SCTP.
  protocolCode(): u8 { return load<u8>(this.rec + 4); }
  // Returns the protocol's name, or "" for an unknown code.
  protocol(): string {
    const c = this.protocolCode();
    return c == 1 ? "TCP" : c == 2 ? "UDP" : c == 3 ? "SCTP" : "";
  }
  // Returns the service's key as Weir prints it: namespace/name:port/protocol.
  key(): string {
    return this.namespace() + "/" + this.name() + ":" + this.portName() + "/" + this.protocol();
  }
  // Returns the scheduler hint's code.
  schedulerCode(): u8 { return load<u8>(this.rec + 5); }
  // Returns the scheduler hint's name; "" for the default or an unknown code.
  scheduler(): string {
    const c = <i32>this.schedulerCode();
    return c < SCHEDULERS.length ? SCHEDULERS[c] : "";
  }
  // Returns the raw service flags.
  flags(): u16 { return load<u16>(this.rec + 6); }
  // Reports externalTrafficPolicy: Local.
  externalLocal(): bool { return (this.flags() & 1) != 0; }
  // Reports internalTrafficPolicy: Local.
  internalLocal(): bool { return (this.flags() & 2) != 0; }
  // Returns the service port.
  port(): u16 { return load<u16>(this.rec + 8); }
  // Returns the node port, 0 if none.
  nodePort(): u16 { return load<u16>(this.rec + 10); }
  // Returns the health-check node port, 0 if none.
  healthCheckNodePort(): u16 { return load<u16>(this.rec + 12); }
  // Returns the ClientIP affinity timeout in seconds; 0 = none.
  affinitySeconds(): u32 { return load<u32>(this.rec + 16); }

  private addrs(from: usize, n: usize): string[] {
    const out = new Array<string>(<i32>n);
    const p = this.rec + SERVICE_HEADER_SIZE + ADDR_SIZE * from;
    for (let i: usize = 0; i < n; i++) out[<i32>i] = addressText(p + ADDR_SIZE * i);
    return out;
  }
  // Returns the cluster IPs as text.
  clusterIPs(): string[] { return this.addrs(0, u16at(this.rec + 48)); }
  // Returns the external IPs as text.
  externalIPs(): string[] { return this.addrs(u16at(this.rec + 48), u16at(this.rec + 50)); }
  // Returns the load-balancer IPs as text.
  loadBalancerIPs(): string[] { return this.addrs(u16at(this.rec + 48) + u16at(this.rec + 50), u16at(this.rec + 52)); }
  // Returns the source ranges as "address/bits".
  sourceRanges(): string[] {
    const n = u16at(this.rec + 54);
    const p = this.rec + pairsOffset(this.rec) - RANGE_SIZE * n;
    const out = new Array<string>(<i32>n);
    for (let i: usize = 0; i < n; i++) {
      const at = p + RANGE_SIZE * i;
      out[<i32>i] = addressText(at) + "/" + load<u8>(at + ADDR_SIZE).toString();
    }
    return out;
  }

  // Returns the number of labels.
  labelCount(): i32 { return <i32>u16at(this.rec + 56); }
  // Returns the number of annotations.
  annotationCount(): i32 { return <i32>u16at(this.rec + 58); }
  private pair(i: i32): usize { return this.rec + pairsOffset(this.rec) + PAIR_SIZE * <usize>i; }
  // Returns label i's key; labels are sorted bytewise by key.
  labelKey(i: i32): string { return strAt(this.batch.base, this.batch.size, this.pair(i)); }
  // Returns label i's value.
  labelValue(i: i32): string { return strAt(this.batch.base, this.batch.size, this.pair(i) + STR_SIZE); }
  // Returns annotation i's key; annotations are sorted bytewise by key.
  annotationKey(i: i32): string { return this.labelKey(this.labelCount() + i); }
  // Returns annotation i's value.
  annotationValue(i: i32): string { return this.labelValue(this.labelCount() + i); }
  // Returns the value of label key, or null.
  label(key: string): string | null { return this.lookup(0, this.labelCount(), key); }
  // Returns the value of annotation key, or null.
  annotation(key: string): string | null { return this.lookup(this.labelCount(), this.annotationCount(), key); }

  // Binary-searches n key-sorted pairs from pair index first.
  private lookup(first: i32, n: i32, key: string): string | null {
    const k = String.UTF8.encode(key);
    let lo = 0, hi = n;
    while (lo < hi) {
      const mid = lo + (hi - lo) / 2;
      const c = compareKey(this.batch.base, this.pair(first + mid), k);
      if (c < 0) lo = mid + 1;
      else if (c > 0) hi = mid;
      else return this.labelValue(first + mid);
    }
    return null;
  }

  // Returns the number of endpoints.
  get length(): i32 { return <i32>load<u32>(this.rec + 20); }

  private slot(i: i32): usize {
    assert(i >= 0 && i < this.length, "endpoint index out of range");
    return this.rec + <usize>load<u32>(this.rec + 60) + this.batch.endpointSize * <usize>i;
  }

  // Returns a view of endpoint slot i; it aborts when i is out of range.
  endpoint(i: i32): Endpoint { return new Endpoint(this.batch, this.slot(i)); }

  // Sets the affinity timeout; 0 clears it; values above 86400 are clamped.
  setAffinity(seconds: u32): void { store<u32>(this.rec + 16, min(seconds, MAX_AFFINITY_SECONDS)); }
  // Sets the scheduler hint by code (0 to 6); it aborts for an unknown code.
  setScheduler(code: u8): void {
    assert(<i32>code < SCHEDULERS.length, "unknown scheduler code");
    store<u8>(this.rec + 5, code);
  }
  // Sets the weight of the endpoint in slot i; 0 drains it.
  setWeight(i: i32, weight: u32): void { store<u32>(this.slot(i) + 20, weight); }

  // Exchanges the endpoints in slots i and j (whole records, with their signals).
  swap(i: i32, j: i32): void {
    const a = this.slot(i), b = this.slot(j), ep = this.batch.endpointSize;
    if (a == b) return;
    const tmp = heap.alloc(ep);
    memory.copy(tmp, a, ep);
    memory.copy(a, b, ep);
    memory.copy(b, tmp, ep);
    heap.free(tmp);
  }

  // Drops the endpoints keep rejects, preserving order, and returns the new
  // count. Kept records move to the first free slot; the slots after the new
  // count keep their old bytes, as with the Go and Rust SDKs.
  keep(keep: (e: Endpoint) => bool): i32 {
    const n = this.length;
    let w = 0;
    for (let i = 0; i < n; i++) {
      const from = this.slot(i);
      if (!keep(new Endpoint(this.batch, from))) continue;
      if (w != i) memory.copy(this.slot(w), from, this.batch.endpointSize);
      w++;
    }
    store<u32>(this.rec + 20, <u32>w);
    return w;
  }

  // Sorts the endpoints by cmp (negative: a first), keeping equal ones in order.
  sortEndpoints(cmp: (a: Endpoint, b: Endpoint) => i32): void {
    const n = this.length;
    if (n < 2) return;
    const first = this.slot(0), ep = this.batch.endpointSize;
    const bytes = ep * <usize>n;
    const orig = heap.alloc(bytes);
    memory.copy(orig, first, bytes);
    const order = new Array<Endpoint>(n);
    for (let i = 0; i < n; i++) order[i] = new Endpoint(this.batch, orig + ep * <usize>i);
    insertionSort(order, cmp);
    for (let i = 0; i < n; i++) memory.copy(first + ep * <usize>i, order[i].rec, ep);
    heap.free(orig);
  }
}

// Sorts a stably by cmp: a binary insertion sort, O(n log n) comparisons.
function insertionSort(a: Endpoint[], cmp: (a: Endpoint, b: Endpoint) => i32): void {
  for (let i = 1; i < a.length; i++) {
    const x = a[i];
    let lo = 0, hi = i;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (cmp(x, a[mid]) < 0) hi = mid;
      else lo = mid + 1;
    }
    for (let j = i; j > lo; j--) a[j] = a[j - 1];
    a[lo] = x;
  }
}

// A view of one endpoint record: 52 bytes, or 60 in version 2.
export class Endpoint {
  constructor(readonly batch: Batch, readonly rec: usize) {}

  // Returns the endpoint's index in the batch Weir sent.
  id(): u32 { return load<u32>(this.rec + 24); }
  // Returns the endpoint's address as text (IPv4-mapped ones as IPv4).
  address(): string { return addressText(this.rec); }
  // Returns the endpoint's port.
  port(): u16 { return load<u16>(this.rec + 16); }
  // Returns the raw flags (Flags.READY, ...).
  flags(): u16 { return load<u16>(this.rec + 18); }
  // Reports whether the endpoint is ready.
  ready(): bool { return (this.flags() & Flags.READY) != 0; }
  // Reports whether the endpoint is serving.
  serving(): bool { return (this.flags() & Flags.SERVING) != 0; }
  // Reports whether the endpoint's pod is shutting down.
  terminating(): bool { return (this.flags() & Flags.TERMINATING) != 0; }
  // Reports whether the endpoint runs on this node.
  local(): bool { return (this.flags() & Flags.LOCAL) != 0; }
  // Reports whether the endpoint serves Cluster-policy traffic.
  forCluster(): bool { return (this.flags() & Flags.FOR_CLUSTER) != 0; }
  // Reports whether the endpoint serves Local-policy traffic.
  forLocal(): bool { return (this.flags() & Flags.FOR_LOCAL) != 0; }
  // Returns the endpoint's share of new connections; 0 drains.
  weight(): u32 { return load<u32>(this.rec + 20); }
  // Returns the endpoint's node name, or "".
  nodeName(): string { return strAt(this.batch.base, this.batch.size, this.rec + 28); }
  // Returns the endpoint's zone, or "".
  zone(): string { return strAt(this.batch.base, this.batch.size, this.rec + 36); }
  // Returns the endpoint's pod name, or "".
  pod(): string { return strAt(this.batch.base, this.batch.size, this.rec + 44); }
  // Returns the number of connections open to the endpoint through Weir's
  // rules on this node when the batch carries signals (version 2), else 0.
  active(): u32 { return this.signal(52); }
  // Returns the number of connections opened to the endpoint since the
  // previous reading of the signals (0 at the first reading) when the batch
  // carries signals (version 2), else 0.
  newConnections(): u32 { return this.signal(56); }

  private signal(field: usize): u32 {
    return this.batch.endpointSize < ENDPOINT_SIZE_V2 ? 0 : load<u32>(this.rec + field);
  }
}
