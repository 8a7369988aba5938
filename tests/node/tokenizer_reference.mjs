// Reference tokenizer for the C++ parity tests and benchmark: @lenml/tokenizers (a dependency-free
// port of transformers.js tokenizers) loading the same tokenizer.json / tokenizer_config.json.
//
//   node tokenizer_reference.mjs encode --tokenizer DIR --input items.json --output out.json
//       items.json: JSON array of strings. out.json: {"ids": [[...], ...], "decoded": [...],
//       "decoded_skip_special": [...]} (decoded* = the reference's decode of its own ids).
//   node tokenizer_reference.mjs bench --tokenizer DIR --input items.json [--passes N]
//       prints {"load_ms", "bytes", "encode_mb_s", "decode_mb_s", "encode_cpu_mb_s", "decode_cpu_mb_s"}
//       measured the way the C++ benchmark measures (one warm-up pass, then the best of N timed passes
//       over every item); *_cpu_* use the process's CPU time.
import fs from "node:fs";
import path from "node:path";
import { TokenizerLoader } from "@lenml/tokenizers";

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) {
    if (fallback === undefined) throw new Error(`missing --${name}`);
    return fallback;
  }
  return process.argv[i + 1];
}

function load(dir) {
  const jsonPath = fs.statSync(dir).isDirectory() ? path.join(dir, "tokenizer.json") : dir;
  const configPath = path.join(path.dirname(jsonPath), "tokenizer_config.json");
  const tokenizerJSON = JSON.parse(fs.readFileSync(jsonPath, "utf8"));
  const tokenizerConfig = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
  return TokenizerLoader.fromPreTrained({ tokenizerJSON, tokenizerConfig });
}

const mode = process.argv[2];
const t0 = performance.now();
const tok = load(arg("tokenizer"));
const loadMs = performance.now() - t0;
const items = JSON.parse(fs.readFileSync(arg("input"), "utf8"));

if (mode === "encode") {
  const ids = items.map((s) => tok.encode(s, { add_special_tokens: false }));
  const decoded = ids.map((x) => tok.decode(x, { skip_special_tokens: false }));
  const decodedSkip = ids.map((x) => tok.decode(x, { skip_special_tokens: true }));
  fs.writeFileSync(arg("output"), JSON.stringify({ ids, decoded, decoded_skip_special: decodedSkip }));
} else if (mode === "bench") {
  const passes = Number(arg("passes", "1"));
  const bytes = items.reduce((n, s) => n + Buffer.byteLength(s, "utf8"), 0);
  let ids = items.map((s) => tok.encode(s, { add_special_tokens: false }));  // warm-up
  const cpu = (since) => { const u = process.cpuUsage(since); return (u.user + u.system) / 1e6; };
  // Each pass timed on its own; the best pass is the least disturbed by other load on the machine.
  let encodeS = Infinity, encodeCpu = Infinity, decodeS = Infinity, decodeCpu = Infinity;
  for (let p = 0; p < passes; ++p) {
    const t = performance.now(), c = process.cpuUsage();
    ids = items.map((s) => tok.encode(s, { add_special_tokens: false }));
    encodeS = Math.min(encodeS, (performance.now() - t) / 1000);
    encodeCpu = Math.min(encodeCpu, cpu(c));
  }
  ids.forEach((x) => tok.decode(x));  // warm-up
  for (let p = 0; p < passes; ++p) {
    const t = performance.now(), c = process.cpuUsage();
    ids.forEach((x) => tok.decode(x));
    decodeS = Math.min(decodeS, (performance.now() - t) / 1000);
    decodeCpu = Math.min(decodeCpu, cpu(c));
  }
  const mb = bytes / 1e6;
  console.log(JSON.stringify({
    load_ms: loadMs, bytes, passes,
    encode_mb_s: mb / encodeS, decode_mb_s: mb / decodeS,
    encode_cpu_mb_s: mb / encodeCpu, decode_cpu_mb_s: mb / decodeCpu,
  }));
} else {
  console.error("usage: node tokenizer_reference.mjs encode|bench --tokenizer DIR --input items.json ...");
  process.exit(2);
}
