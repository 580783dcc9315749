// The test module: the SDK's accessors and edits exported for test/run.mjs,
// which checks them against the ABI's shared vectors.

import { Batch, Endpoint, Service, configure, weir_abi_version, weir_alloc, weir_free } from "../assembly/index";

export { weir_abi_version, weir_alloc, weir_free };

const SEP = "\u0000";

// Returns every field of the batch at ptr, in the order run.mjs lists them
// from the vector's JSON, joined by NUL; "parse error: ..." when it does not parse.
export function dump(ptr: usize, len: u32): string {
  const b = Batch.parse(ptr, len);
  if (b === null) return "parse error: " + Batch.lastError;
  const out = new Array<string>();
  out.push(b.version().toString());
  out.push(b.nodeName());
  out.push(b.nodeZone());
  out.push(b.full ? "true" : "false");
  out.push(b.length.toString());
  for (let i = 0; i < b.length; i++) dumpService(out, b.service(i));
  return out.join(SEP);
}

function dumpService(out: string[], s: Service): void {
  out.push(s.namespace());
  out.push(s.name());
  out.push(s.portName());
  out.push(s.protocol());
  out.push(s.protocolCode().toString());
  out.push(s.scheduler());
  out.push(s.schedulerCode().toString());
  out.push(s.flags().toString());
  out.push(s.externalLocal() ? "true" : "false");
  out.push(s.internalLocal() ? "true" : "false");
  out.push(s.port().toString());
  out.push(s.nodePort().toString());
  out.push(s.healthCheckNodePort().toString());
  out.push(s.affinitySeconds().toString());
  out.push(s.clusterIPs().join(","));
  out.push(s.externalIPs().join(","));
  out.push(s.loadBalancerIPs().join(","));
  out.push(s.sourceRanges().join(","));
  for (let i = 0; i < s.labelCount(); i++) {
    out.push(s.labelKey(i) + "=" + s.labelValue(i));
    const v = s.label(s.labelKey(i));
    out.push(v === null ? "(missing)" : v);
  }
  for (let i = 0; i < s.annotationCount(); i++) {
    out.push(s.annotationKey(i) + "=" + s.annotationValue(i));
    const v = s.annotation(s.annotationKey(i));
    out.push(v === null ? "(missing)" : v);
  }
  out.push(s.length.toString());
  for (let j = 0; j < s.length; j++) dumpEndpoint(out, s.endpoint(j));
}

function dumpEndpoint(out: string[], e: Endpoint): void {
  out.push(e.id().toString());
  out.push(e.address());
  out.push(e.port().toString());
  out.push(e.flags().toString());
  const bits = [e.ready(), e.serving(), e.terminating(), e.local(), e.forCluster(), e.forLocal()];
  for (let i = 0; i < bits.length; i++) out.push(bits[i] ? "true" : "false");
  out.push(e.weight().toString());
  out.push(e.nodeName());
  out.push(e.zone());
  out.push(e.pod());
  out.push(e.active().toString());
  out.push(e.newConnections().toString());
}

// Returns service i's endpoints in slot order as "id:active:new" joined by
// commas, for run.mjs to check that edits carry the signals along.
export function signals(ptr: usize, len: u32, service: i32): string {
  const b = Batch.parse(ptr, len);
  if (b === null) return "parse error: " + Batch.lastError;
  const s = b.service(service);
  const out = new Array<string>();
  for (let j = 0; j < s.length; j++) {
    const e = s.endpoint(j);
    out.push(e.id().toString() + ":" + e.active().toString() + ":" + e.newConnections().toString());
  }
  return out.join(",");
}

// Makes one edit of an output vector to the batch at ptr; returns 0, or 1
// when the batch does not parse or the op is unknown.
export function edit(ptr: usize, len: u32, service: i32, op: i32, args: usize, nargs: i32): i32 {
  const b = Batch.parse(ptr, len);
  if (b === null) return 1;
  const s = b.service(service);
  const a0 = nargs > 0 ? load<u32>(args) : 0;
  const a1 = nargs > 1 ? load<u32>(args, 4) : 0;
  switch (op) {
    case 0: s.setWeight(<i32>a0, a1); break;
    case 1: s.swap(<i32>a0, <i32>a1); break;
    case 2: keepIDs(s, args, nargs); break;
    case 3: s.sortEndpoints((a: Endpoint, b: Endpoint): i32 => b.weight() > a.weight() ? 1 : b.weight() < a.weight() ? -1 : 0); break;
    case 4: s.setAffinity(a0); break;
    case 5: s.setScheduler(<u8>a0); break;
    default: return 1;
  }
  return 0;
}

// The ids keepIDs keeps; a global, since AssemblyScript has no closures.
let kept: u32[] = [];

function keepIDs(s: Service, args: usize, n: i32): void {
  kept = new Array<u32>(n);
  for (let i = 0; i < n; i++) kept[i] = load<u32>(args + 4 * <usize>i);
  s.keep((e: Endpoint): bool => kept.includes(e.id()));
}

// Runs configure with a callback that accepts "null" and refuses anything else.
export function configureNullOnly(ptr: usize, len: u32): u32 {
  return configure(ptr, len, (config: string): string | null => config.trim() == "null" ? null : "config: want null, got " + config);
}
