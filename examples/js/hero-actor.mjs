#!/usr/bin/env node
// A hero-bus actor in JavaScript, written from PROTOCOL.md alone: Node's built-in Ed25519,
// RFC 8785 canonical JSON for integer-only content, and a minimal RESP client over `net`.
// No npm dependency.
//
//   node hero-actor.mjs keygen KEYFILE              create a key (0600), print what to register
//   node hero-actor.mjs pubkey KEYFILE              print its public key (hex)
//   HERO_REDIS_URL="$(hero-node credentials client)" \
//   node hero-actor.mjs submit --key KEYFILE --actor ID --script 'print(6*7)' [options]
//                                                   sign a job, queue it, wait, print stdout
//   node hero-actor.mjs selftest VECTOR_DIR         check this code against ed25519-*.json
//
// Exit codes: 0 done (the job finished), 1 the job ended in error or no reply came,
// 2 a usage or input mistake.

import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";

const DOMAIN_PREFIX = "hero-bus/v1/";
const KEY_KIND = "hero-ed25519-key";
// An Ed25519 private key in PKCS#8 DER is this fixed prefix followed by the 32-byte seed.
const PKCS8_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");

class UsageError extends Error {}

// -- canonical JSON and signatures (PROTOCOL.md "Signing") ---------------------------------

// RFC 8785 for content made only of strings, safe integers, lists and objects: keys sorted by
// UTF-16 code units (what Array.prototype.sort compares), no whitespace, strings as
// JSON.stringify writes them.
function canonical(value) {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) throw new UsageError(`not a safe integer: ${value}`);
    return String(value);
  }
  if (value === null || typeof value === "boolean") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
  }
  throw new UsageError(`cannot sign a ${typeof value}`);
}

function signingInput(domain, value) {
  return Buffer.from(`${DOMAIN_PREFIX}${domain}\n${canonical(value)}`, "utf8");
}

function keyFromSeed(seedHex) {
  const seed = Buffer.from(seedHex, "hex");
  if (seed.length !== 32) throw new UsageError("an Ed25519 seed is 32 bytes (64 hex characters)");
  const privateKey = crypto.createPrivateKey({
    key: Buffer.concat([PKCS8_PREFIX, seed]),
    format: "der",
    type: "pkcs8",
  });
  const jwk = crypto.createPublicKey(privateKey).export({ format: "jwk" });
  return { privateKey, publicHex: Buffer.from(jwk.x, "base64url").toString("hex") };
}

function sign(key, domain, value) {
  const signature = crypto.sign(null, signingInput(domain, value), key.privateKey);
  return { algorithm: "ed25519", public_key: key.publicHex, signature: signature.toString("hex") };
}

// -- key files -----------------------------------------------------------------------------

function keygen(file) {
  const seedHex = crypto.randomBytes(32).toString("hex");
  const key = keyFromSeed(seedHex);
  const doc = { kind: KEY_KIND, version: 1, public_key: key.publicHex, seed: seedHex };
  try {
    fs.writeFileSync(file, `${JSON.stringify(doc)}\n`, { mode: 0o600, flag: "wx" });
  } catch (err) {
    throw new UsageError(`cannot create ${file}: ${err.code === "EEXIST" ? "it exists" : err.message}`);
  }
  console.log(key.publicHex);
  console.error(
    `register it on the node (as its operator), then submit with --actor ID:\n` +
      `  hero-node actor add --id ID --pubkey ${key.publicHex}\n` +
      `  hero-node context add 1 --admin <admin id> --executor ID`,
  );
}

function loadKey(file) {
  let doc;
  try {
    doc = JSON.parse(fs.readFileSync(file, "utf8"));
  } catch (err) {
    throw new UsageError(`cannot read key file ${file}: ${err.message}`);
  }
  if (doc.kind !== KEY_KIND || typeof doc.seed !== "string") {
    throw new UsageError(`${file} is not an unencrypted ${KEY_KIND} file`);
  }
  const key = keyFromSeed(doc.seed);
  if (doc.public_key !== key.publicHex) throw new UsageError(`${file}: public_key does not match`);
  return key;
}

// -- a minimal RESP client ------------------------------------------------------------------

// One parsed reply from buf at offset, as [value, next offset], or null if incomplete.
function parseReply(buf, offset) {
  const end = buf.indexOf("\r\n", offset);
  if (end < 0) return null;
  const kind = String.fromCharCode(buf[offset]);
  const line = buf.toString("utf8", offset + 1, end);
  const next = end + 2;
  if (kind === "+") return [line, next];
  if (kind === "-") return [new Error(line), next];
  if (kind === ":") return [Number(line), next];
  if (kind === "$") {
    const size = Number(line);
    if (size < 0) return [null, next];
    if (buf.length < next + size + 2) return null;
    return [buf.toString("utf8", next, next + size), next + size + 2];
  }
  if (kind === "*") {
    const count = Number(line);
    if (count < 0) return [null, next];
    const items = [];
    let at = next;
    for (let i = 0; i < count; i++) {
      const item = parseReply(buf, at);
      if (item === null) return null;
      items.push(item[0]);
      at = item[1];
    }
    return [items, at];
  }
  throw new Error(`unexpected RESP reply type ${JSON.stringify(kind)}`);
}

class Redis {
  constructor(socket) {
    this.socket = socket;
    this.buffer = Buffer.alloc(0);
    this.waiting = [];
    socket.on("data", (chunk) => this.#received(chunk));
    socket.on("error", (err) => this.#failAll(err));
    socket.on("close", () => this.#failAll(new Error("connection closed")));
  }

  static connect(url) {
    const target = parseUrl(url);
    return new Promise((resolve, reject) => {
      const socket = target.path
        ? net.createConnection(target.path)
        : net.createConnection(target.port, target.host);
      socket.once("error", reject);
      socket.once("connect", () => {
        socket.off("error", reject);
        resolve({ redis: new Redis(socket), target });
      });
    });
  }

  // Send one command; resolves with its reply, rejects with a server error.
  call(...args) {
    const parts = [`*${args.length}\r\n`];
    for (const arg of args.map(String)) parts.push(`$${Buffer.byteLength(arg)}\r\n${arg}\r\n`);
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.socket.write(parts.join(""));
    });
  }

  close() {
    this.socket.end();
  }

  #received(chunk) {
    this.buffer = Buffer.concat([this.buffer, chunk]);
    for (;;) {
      const parsed = parseReply(this.buffer, 0);
      if (parsed === null) return;
      this.buffer = this.buffer.subarray(parsed[1]);
      const { resolve, reject } = this.waiting.shift();
      if (parsed[0] instanceof Error) reject(parsed[0]);
      else resolve(parsed[0]);
    }
  }

  #failAll(err) {
    for (const { reject } of this.waiting.splice(0)) reject(err);
  }
}

// redis://user:pass@host:port or unix://user:pass@/path/to.sock (hero-node credentials client).
function parseUrl(url) {
  const m = /^(redis|unix):\/\/(?:([^:@/]*)(?::([^@]*))?@)?(.*)$/.exec(url || "");
  if (!m) throw new UsageError("HERO_REDIS_URL must be a redis:// or unix:// URL");
  const [, scheme, user, password, rest] = m;
  const auth = { user: decodeURIComponent(user || ""), password: decodeURIComponent(password || "") };
  if (scheme === "unix") return { ...auth, path: rest.split("?")[0] };
  const [hostPort] = rest.split("/");
  const colon = hostPort.lastIndexOf(":");
  return { ...auth, host: hostPort.slice(0, colon) || "127.0.0.1", port: Number(hostPort.slice(colon + 1)) };
}

// -- submitting a job (PROTOCOL.md "Submitting a job") --------------------------------------

function newId() {
  const id = crypto.randomBytes(8).readBigUInt64BE() & ((1n << 53n) - 1n);
  return Number(id === 0n ? 1n : id);
}

function buildMessage(opts, origin) {
  const now = Math.floor(Date.now() / 1000);
  const job = {
    id: newId(),
    caller_id: opts.actor,
    context_id: opts.context,
    script: opts.script,
    script_type: opts.type,
    timeout: opts.timeout,
    retries: 0,
    env_vars: {},
    prerequisites: [],
    depends: [],
  };
  const signed = {
    id: newId(),
    caller_id: opts.actor,
    context_id: opts.context,
    message: "",
    message_type: "job",
    message_format_type: "text",
    timeout: opts.timeout,
    timeout_ack: 120,
    timeout_result: 3600,
    created_at: now,
    origin,
    destination: opts.to === "self" ? origin : opts.to,
    nonce: crypto.randomBytes(16).toString("hex"),
    job: [job],
    // the trace this job belongs to (PROTOCOL.md 4.5), signed with the rest
    traceparent: opts.traceparent ?? newTraceparent(),
  };
  if (opts.tracestate) signed.tracestate = opts.tracestate;
  return { signed, now };
}

// -- trace context (PROTOCOL.md 4.5) ---------------------------------------------------------

const TRACEPARENT = /^00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$/;

// A new trace: random ids, flags 00 (nobody recorded a parent span).
function newTraceparent() {
  return `00-${crypto.randomBytes(16).toString("hex")}-${crypto.randomBytes(8).toString("hex")}-00`;
}

// The stored hash: every integer as decimal text, the job list and signatures as JSON.
function storedHash(signed, signature, now) {
  const hash = { ...signed, updated_at: now, status: "dispatched", logs: "[]" };
  hash.job = JSON.stringify(signed.job);
  hash.signatures = JSON.stringify([signature]);
  return Object.entries(hash).flatMap(([k, v]) => [k, String(v)]);
}

async function submit(opts) {
  const key = loadKey(opts.key);
  const { redis, target } = await Redis.connect(process.env.HERO_REDIS_URL);
  try {
    if (target.password) await redis.call("AUTH", target.user || "default", target.password);
    await redis.call("SELECT", 0);
    const origin = await redis.call("HGET", "node:info", "id");
    if (!origin) throw new Error("no hero-node has run on this Valkey (no node:info id)");
    await redis.call("SELECT", opts.context);
    const { signed, now } = buildMessage(opts, origin);
    const signature = sign(key, "message", signed);
    const messageKey = `message:${signed.caller_id}:${signed.id}`;
    await redis.call("HSET", messageKey, ...storedHash(signed, signature, now));
    await redis.call("LPUSH", "msg_out", messageKey);
    console.error(
      `submitted ${messageKey} (job:${signed.caller_id}:${signed.job[0].id}) in trace ${signed.traceparent}`,
    );
    const popped = await redis.call("BLPOP", `reply:${messageKey}`, opts.wait);
    if (popped === null) {
      console.error(`no reply within ${opts.wait} s`);
      return 1;
    }
    const reply = JSON.parse(popped[1]);
    process.stdout.write(reply.result.stdout ?? "");
    if (reply.status !== "finished") {
      console.error(`job ${reply.job_key} ended in ${reply.status}: ${reply.reason}`);
      return 1;
    }
    return 0;
  } finally {
    redis.close();
  }
}

// -- self test against the conformance vectors -----------------------------------------------

function selftest(dir) {
  const files = fs.readdirSync(dir).filter((f) => /^ed25519-.*\.json$/.test(f)).sort();
  if (files.length === 0) throw new UsageError(`no ed25519-*.json vectors in ${dir}`);
  let failed = 0;
  for (const file of files) {
    const v = JSON.parse(fs.readFileSync(path.join(dir, file), "utf8"));
    const key = keyFromSeed(v.key.secret);
    const input = signingInput(v.domain, v.object);
    const checks = {
      public_key: key.publicHex === v.key.public,
      canonical: canonical(v.object) === v.canonical,
      signing_input: input.toString("hex") === v.signing_input_hex,
      signature: sign(key, v.domain, v.object).signature === v.signature,
      verifies: crypto.verify(null, input, crypto.createPublicKey(key.privateKey), Buffer.from(v.signature, "hex")),
    };
    const bad = Object.keys(checks).filter((name) => !checks[name]);
    failed += bad.length ? 1 : 0;
    console.log(`${file}: ${bad.length ? `FAILED ${bad.join(", ")}` : "ok"}`);
  }
  return failed ? 1 : 0;
}

// -- command line ----------------------------------------------------------------------------

function parseOptions(argv) {
  const opts = { context: 1, to: "self", type: "python", timeout: 60, wait: 90 };
  const numeric = new Set(["actor", "context", "timeout", "wait"]);
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, "");
    if (!argv[i].startsWith("--") || i + 1 >= argv.length) throw new UsageError(`bad option ${argv[i]}`);
    const value = argv[i + 1];
    if (numeric.has(name) && !/^[0-9]+$/.test(value)) throw new UsageError(`--${name} takes an integer`);
    opts[name] = numeric.has(name) ? Number(value) : value;
  }
  for (const required of ["key", "actor", "script"]) {
    if (opts[required] === undefined) throw new UsageError(`submit needs --${required}`);
  }
  // a caller inside a trace hands it on (W3C TRACEPARENT/TRACESTATE, as the environment
  // variables of OpenTelemetry's conventions name them); a node checks it again anyway
  opts.traceparent ??= process.env.TRACEPARENT;
  opts.tracestate ??= process.env.TRACESTATE;
  if (opts.traceparent !== undefined && !TRACEPARENT.test(opts.traceparent)) {
    throw new UsageError("--traceparent takes 00-<32 hex>-<16 hex>-<2 hex> (W3C, lowercase)");
  }
  if (opts.tracestate !== undefined && Buffer.byteLength(opts.tracestate) > 512) {
    throw new UsageError("--tracestate takes at most 512 bytes");
  }
  if (opts.to !== "self" && !/^[0-9a-f]{64}$/.test(opts.to)) {
    throw new UsageError("--to takes 'self' or a node id (64 lowercase hex characters)");
  }
  return opts;
}

async function main(argv) {
  const [command, ...rest] = argv;
  if (command === "keygen" && rest.length === 1) return keygen(rest[0]) ?? 0;
  if (command === "pubkey" && rest.length === 1) return console.log(loadKey(rest[0]).publicHex) ?? 0;
  if (command === "selftest" && rest.length === 1) return selftest(rest[0]);
  if (command === "submit") return submit(parseOptions(rest));
  throw new UsageError("usage: hero-actor.mjs keygen|pubkey KEYFILE | submit --key F --actor ID --script S [--traceparent TP] | selftest DIR");
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err) => {
    console.error(`error: ${err.message}`);
    process.exit(err instanceof UsageError ? 2 : 1);
  },
);
