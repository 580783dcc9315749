// Checks the AssemblyScript SDK against the ABI's shared test vectors
// (sdk/abi/testdata/vectors, written by the Go SDK): every batch must read
// back as its JSON, and the edits of every output vector must give its
// bytes exactly. Run by `npm test` after build/vectors.wasm is built.

import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const vectors = process.env.WEIR_VECTORS ?? join(here, "..", "..", "abi", "testdata", "vectors");
const wasm = new WebAssembly.Module(readFileSync(process.env.WEIR_AS_TEST_WASM ?? join(here, "..", "build", "vectors.wasm")));
const OPS = { setWeight: 0, swap: 1, keep: 2, sortByWeightDesc: 3, setAffinity: 4, setScheduler: 5 };

let failures = 0;
function fail(msg) {
  failures++;
  console.error("FAIL " + msg);
}

// instantiate returns a fresh instance whose stderr lines collect in .stderr.
function instantiate() {
  const inst = { stderr: "" };
  const wasi = {
    fd_write(fd, iovs, n, written) {
      const view = new DataView(inst.exports.memory.buffer);
      let total = 0;
      for (let i = 0; i < n; i++) {
        const p = view.getUint32(iovs + 8 * i, true), len = view.getUint32(iovs + 8 * i + 4, true);
        inst.stderr += Buffer.from(inst.exports.memory.buffer, p, len).toString("utf8");
        total += len;
      }
      view.setUint32(written, total, true);
      return 0;
    },
  };
  inst.exports = new WebAssembly.Instance(wasm, { wasi_snapshot_preview1: wasi }).exports;
  return inst;
}

// put copies bytes into a fresh weir_alloc block and returns its address.
function put(inst, bytes) {
  const ptr = inst.exports.weir_alloc(bytes.length);
  new Uint8Array(inst.exports.memory.buffer, ptr, bytes.length).set(bytes);
  return ptr;
}

// string reads an AssemblyScript string (UTF-16, byte length in front) at ptr.
function string(inst, ptr) {
  const len = new DataView(inst.exports.memory.buffer).getUint32(ptr - 4, true);
  return Buffer.from(inst.exports.memory.buffer, ptr, len).toString("utf16le");
}

const read = (name) => readFileSync(join(vectors, name));
const readJSON = (name) => JSON.parse(read(name).toString("utf8"));
const index = readJSON("index.json");

// expected lists a batch's fields from its JSON in test/vectors.ts's dump order.
function expected(b) {
  const out = [String(b.version), b.node.name, b.node.zone, String(b.full), String(b.services.length)];
  for (const s of b.services) {
    out.push(s.namespace, s.name, s.portName, s.protocol, String(s.protocolCode), s.scheduler,
      String(s.schedulerCode), String(s.flags), String(s.externalLocal), String(s.internalLocal),
      String(s.port), String(s.nodePort), String(s.healthCheckNodePort), String(s.affinitySeconds),
      s.clusterIPs.join(","), s.externalIPs.join(","), s.loadBalancerIPs.join(","), s.sourceRanges.join(","));
    for (const p of [...s.labels, ...s.annotations]) out.push(p.key + "=" + p.value, p.value);
    out.push(String(s.endpoints.length));
    for (const e of s.endpoints) {
      out.push(String(e.id), e.address, String(e.port), String(e.flags), String(e.ready), String(e.serving),
        String(e.terminating), String(e.local), String(e.forCluster), String(e.forLocal), String(e.weight),
        e.nodeName, e.zone, e.pod, String(e.active), String(e.new));
    }
  }
  return out;
}

function checkBatches() {
  for (const name of index.batches) {
    const inst = instantiate();
    const bin = read(`batches/${name}.bin`);
    const got = string(inst, inst.exports.dump(put(inst, bin), bin.length)).split("\u0000");
    const want = expected(readJSON(`batches/${name}.json`));
    const i = want.findIndex((w, k) => got[k] !== w);
    if (i >= 0 || got.length !== want.length) {
      fail(`batch ${name}: field ${i}: got ${JSON.stringify(got[i])}, want ${JSON.stringify(want[i])} (${got.length} fields, want ${want.length})`);
    }
  }
}

function checkOutputs() {
  for (const name of index.outputs) {
    const inst = instantiate();
    const v = readJSON(`outputs/${name}.json`);
    const input = read(`batches/${v.input}.bin`);
    const ptr = put(inst, input);
    for (const e of v.edits) {
      const args = put(inst, new Uint8Array(new Uint32Array(e.args.length ? e.args : [0]).buffer));
      if (inst.exports.edit(ptr, input.length, e.service, OPS[e.op], args, e.args.length) !== 0) {
        fail(`output ${name}: edit ${e.op} failed`);
      }
    }
    const got = Buffer.from(inst.exports.memory.buffer, ptr, input.length);
    if (!got.equals(read(`outputs/${name}.bin`))) fail(`output ${name}: the bytes differ from the vector's`);
    checkSignalsTravel(inst, name, ptr, input.length, readJSON(`batches/${v.input}.json`));
  }
}

// checkSignalsTravel checks that every endpoint left in the edited batch has
// the signals its id had in the batch sent: edits move whole records.
function checkSignalsTravel(inst, name, ptr, len, sent) {
  sent.services.forEach((s, i) => {
    const text = string(inst, inst.exports.signals(ptr, len, i));
    const got = text === "" ? [] : text.split(",");
    const want = got.map((g) => {
      const e = s.endpoints[Number(g.split(":")[0])];
      return `${e.id}:${e.active}:${e.new}`;
    });
    if (got.join(",") !== want.join(",")) fail(`output ${name}: service ${i}: signals ${got}, want ${want}`);
  });
}

function checkRejects() {
  const cases = [
    ["unaligned record", (b) => { b[32] += 2; }, "parse error: service 0: record offset"], // the first record's offset
    ["version 0", (b) => { b[4] = 0; }, "parse error: batch version 0, want 1 or 2"],
    ["version 3", (b) => { b[4] = 3; }, "parse error: batch version 3, want 1 or 2"],
    // 60-byte records: the endpoint array no longer fits the record.
    ["version 1 read as 2", (b) => { b[4] = 2; }, "parse error: service 0: endpoint array goes past"],
  ];
  for (const [what, mutate, want] of cases) {
    const inst = instantiate();
    const bin = Buffer.from(read("batches/every-field.bin"));
    mutate(bin);
    const got = string(inst, inst.exports.dump(put(inst, bin), bin.length));
    if (!got.startsWith(want)) fail(`${what}: got ${JSON.stringify(got)}`);
  }
}

function checkABIVersion() {
  const got = instantiate().exports.weir_abi_version();
  if (got !== 2) fail(`weir_abi_version returned ${got}, want 2`);
}

function checkAbortReportsLocation() {
  const inst = instantiate();
  const bin = read("batches/simple.bin");
  try {
    inst.exports.edit(put(inst, bin), bin.length, 5, 0, put(inst, new Uint8Array(8)), 2);
    fail("an out-of-range service index did not trap");
  } catch (e) {
    if (!(e instanceof WebAssembly.RuntimeError)) throw e;
  }
  if (!/^weir: panic at (.*\/)?assembly\/index\.ts:\d+:\d+: service index out of range\n$/.test(inst.stderr)) {
    fail(`abort line: got ${JSON.stringify(inst.stderr)}`);
  }
}

function checkConfigure() {
  const inst = instantiate();
  for (const [text, want] of [["null", 0], [" null\n", 0], ['{"x":1}', 4]]) {
    const bytes = Buffer.from(text, "utf8");
    const got = inst.exports.configureNullOnly(put(inst, bytes), bytes.length);
    if (got !== want) fail(`configure ${JSON.stringify(text)}: status ${got}, want ${want}`);
  }
  if (inst.stderr !== 'config: want null, got {"x":1}\n') fail(`configure logged ${JSON.stringify(inst.stderr)}`);
}

checkABIVersion();
checkBatches();
checkOutputs();
checkConfigure();
checkRejects();
checkAbortReportsLocation();
if (failures > 0) {
  console.error(`${failures} failures`);
  process.exit(1);
}
console.log(`ok: ABI version, ${index.batches.length} batches, ${index.outputs.length} outputs, configure, rejects, abort`);
