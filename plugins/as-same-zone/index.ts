// as-same-zone is a Weir hook plugin written in AssemblyScript with the
// AssemblyScript SDK (sdk/assemblyscript): for every service annotated
// same-zone.weir.dev/only: "true" it keeps only the endpoints in this
// node's zone, when there is at least one; other services pass unchanged.

import { Batch, Endpoint, Service, process } from "../../sdk/assemblyscript/assembly/index";

export { weir_abi_version, weir_alloc, weir_free } from "../../sdk/assemblyscript/assembly/index";

const ANNOTATION = "same-zone.weir.dev/only";

// The zone keepZone keeps; a global, since AssemblyScript has no closures.
let zone = "";

// Processes one batch in place; Weir calls it with a batch from weir_alloc.
export function weir_process(ptr: usize, len: u32): u64 {
  return process(ptr, len, sameZone);
}

function sameZone(b: Batch): string | null {
  zone = b.nodeZone();
  if (zone.length == 0) return null; // a node without a zone: nothing to prefer
  for (let i = 0; i < b.length; i++) {
    const s = b.service(i);
    const only = s.annotation(ANNOTATION);
    if (only !== null && only == "true" && hasZoneEndpoint(s)) s.keep(inZone);
  }
  return null;
}

function hasZoneEndpoint(s: Service): bool {
  for (let j = 0; j < s.length; j++) {
    if (inZone(s.endpoint(j))) return true;
  }
  return false;
}

function inZone(e: Endpoint): bool {
  return e.zone() == zone;
}
