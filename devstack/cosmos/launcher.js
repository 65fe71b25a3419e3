#!/usr/bin/env node
// Local Cosmos DB server for tests and the dev stack: @vercel/cosmosdb-server,
// pinned to 1.0.1, with the bugs that matter to us patched at start-up and a
// fault-injection switch ("throttle the store"). See docs/cosmos-server.md.
//
// The patches reach into the package's compiled handlers, so the version is
// checked first: a different version must be re-validated, not silently used.
//
// Usage: node launcher.js [--port N] [--host 127.0.0.1] [--faults JSON] [--data-file PATH]
//   --port 0 (the default) picks a free port; the ready line names it:
//   "cosmosdb-server ready at https://127.0.0.1:PORT/ ..."
"use strict";

const PINNED_VERSION = "1.0.1";
const PKG = "@vercel/cosmosdb-server";

function fail(message) {
  process.stderr.write(`cosmosdb launcher: ${message}\n`);
  process.exit(2);
}

let pkgJson;
try {
  pkgJson = require(`${PKG}/package.json`);
} catch (err) {
  fail(`cannot load ${PKG} (run npm ci in the repository root): ${err.message}`);
}
if (pkgJson.version !== PINNED_VERSION) {
  fail(`${PKG} is ${pkgJson.version}; the patches are written for ${PINNED_VERSION}`);
}
const lib = name => require(`${PKG}/lib/${name}`);

// --- arguments ----------------------------------------------------------------------

function parseArgs(argv) {
  const args = { port: 0, host: "127.0.0.1", faults: [], dataFile: null };
  for (let i = 0; i < argv.length; i += 1) {
    const key = argv[i];
    const value = argv[i + 1];
    if (key === "--port") {
      args.port = parseInt(value, 10);
      i += 1;
    } else if (key === "--host") {
      args.host = value;
      i += 1;
    } else if (key === "--data-file") {
      args.dataFile = value;
      i += 1;
    } else if (key === "--faults") {
      args.faults = JSON.parse(value);
      i += 1;
    } else {
      fail(`unknown argument ${key}`);
    }
  }
  if (!Number.isInteger(args.port) || args.port < 0 || args.port > 65535) {
    fail("--port must be 0..65535");
  }
  return args;
}

// --- patches (before lib/routes is loaded: it captures the handlers) -----------------

const applied = [];

// Bug 1: reading a missing document throws a TypeError in the handler
// (`data[path]` on undefined) and answers 500; Cosmos answers 404 NotFound.
{
  const readDocument = lib("handler/read-document");
  const pk = lib("utils/get-partition-from-header");
  const original = readDocument.default;
  readDocument.default = (account, req, res, params) => {
    const collection = account.database(params.dbId).collection(params.collId);
    const header = pk.default(req);
    if (collection.read() && header !== undefined) {
      let partition;
      try {
        partition = pk.parsePartitionKey(header, params.docId);
      } catch (err) {
        return original(account, req, res, params);
      }
      if (!collection.document(params.docId, partition).read()) {
        res.statusCode = 404;
        return {
          code: "NotFound",
          message: "Entity with the specified id does not exist in the system."
        };
      }
    }
    return original(account, req, res, params);
  };
  applied.push("read-missing-404");
}

// Bug 3: a patch's filter predicate is lowercased before it is evaluated, so a
// predicate naming a property or value with capitals never matches (412).
// Evaluate the predicate here, case intact, then run the patch without it. Cosmos's
// predicate is "FROM <alias> WHERE <condition>" with any alias, evaluated on the
// document being patched only: run it as a query over that one document (not over
// the container by id, which let a same-id item of another partition satisfy it).
{
  const patchOps = lib("handler/_patch-operations");
  const pk = lib("utils/get-partition-from-header");
  const original = patchOps.patchOperation;
  const conditionQuery = condition => {
    const text = condition.trim();
    if (/^select\s/i.test(text)) return text;
    if (/^from\s/i.test(text)) return `SELECT * ${text}`;
    if (/^where\s/i.test(text)) return `SELECT * FROM c ${text}`;
    return `SELECT * FROM c WHERE ${text}`;
  };
  patchOps.patchOperation = (collection, input) => {
    if (!input.condition) {
      return original(collection, input);
    }
    let data;
    try {
      data = collection
        .document(input.id, pk.parsePartitionKey(input.partitionKey, input.id))
        .read();
    } catch (err) {
      return original(collection, input);
    }
    if (!data || (input.ifMatch && input.ifMatch !== data._etag)) {
      return original(collection, { ...input, condition: undefined }); // 404 / 412
    }
    let matched;
    try {
      const documents = collection.documents;
      matched = documents._getQuery(conditionQuery(input.condition))
        .exec([data], { udf: documents._userDefinedFunctions() }).result.length > 0;
    } catch (err) {
      return {
        statusCode: 400,
        body: { code: "BadRequest", message: `Invalid condition in patch request: ${err.message}` }
      };
    }
    if (!matched) {
      return {
        statusCode: 412,
        body: {
          code: "PreconditionFailed",
          message: "Condition specified in the patch request is not satisfied."
        }
      };
    }
    return original(collection, { ...input, condition: undefined });
  };
  applied.push("patch-condition-case");
}

// Bug 2 (in part): a transactional batch (the Python SDK's execute_item_batch) carries
// its partition key in the request header, not in each operation; the batch
// handler reads only the operation's own and answers 500. Give every
// operation without one the header's. (Atomicity: batch-atomic, below.)
{
  const json = lib("json");
  const pk = lib("utils/get-partition-from-header");
  const original = json.default;
  json.default = async req => {
    const body = await original(req);
    const header = pk.default(req);
    if (Array.isArray(body) && header !== undefined && req.headers["x-ms-cosmos-is-batch-request"]) {
      for (const op of body) {
        if (op && op.partitionKey === undefined) {
          op.partitionKey = header;
        }
      }
    }
    return body;
  };
  applied.push("batch-partition-key-header");
}

// Bug 2 (the rest): a transactional batch is not atomic: when an operation fails, the
// ones before it stay applied and answer 2xx. Cosmos runs the batch as one
// transaction: on a failure nothing is applied, the failed operation answers its own
// status and every other one 424 Failed Dependency
// (https://learn.microsoft.com/azure/cosmos-db/nosql/transactional-batch). Patch,
// which the package refuses in a batch (400), runs as a single patch does (with a
// filter predicate: patch-condition-case). Before the first operation, the batch
// keeps what each item it names held; on a failure it puts those back (body read,
// operations and undo all run in one synchronous stretch: no other request between).
{
  const batch = lib("handler/batch-documents");
  const json = lib("json");
  const trueHeader = lib("true-header").default;
  const ops = lib("handler/_document-operations");
  const patchOps = lib("handler/_patch-operations");
  const pk = lib("utils/get-partition-from-header");
  const original = batch.default;
  const run = {
    Create: ops.createOperation,
    Upsert: ops.upsertOperation,
    Read: ops.readOperation,
    Delete: ops.deleteOperation,
    Replace: ops.replaceOperation,
    Patch: (collection, input) =>
      patchOps.patchOperation(collection, {
        id: input.id,
        partitionKey: input.partitionKey,
        ifMatch: input.ifMatch,
        operations: (input.resourceBody || {}).operations,
        condition: (input.resourceBody || {}).condition
      })
  };
  batch.default = async (account, req, res, params) => {
    if (!trueHeader(req, "x-ms-cosmos-batch-atomic")) {
      return original(account, req, res, params);
    }
    const body = await json.default(req);
    const collection = account.database(params.dbId).collection(params.collId);
    if (!collection.read()) {
      res.statusCode = 404;
      return {};
    }
    if (!Array.isArray(body)) {
      res.statusCode = 400;
      return { message: "Invalid request body" };
    }
    const unknown = body.find(input => !input || !run[input.operationType]);
    if (unknown !== undefined) {
      res.statusCode = 400;
      return {
        message: `Operation type '${unknown ? unknown.operationType : null}' is not supported in Batch.`
      };
    }
    const documents = collection.documents;
    const before = new Map(); // index key -> [id, partition, the item before the batch]
    const keep = (id, partition) => {
      if (id === undefined) return;
      const key = documents._getId("/id", id, partition);
      if (!before.has(key)) {
        before.set(key, [id, partition, documents._item("/id", id, partition).read()]);
      }
    };
    for (const input of body) {
      const id = input.id !== undefined ? input.id : (input.resourceBody || {}).id;
      try {
        keep(id, pk.parsePartitionKey(input.partitionKey, id));
      } catch (err) {
        // no usable partition key: the operation itself fails (and the batch with it)
      }
      if (input.resourceBody && input.resourceBody.id !== undefined) {
        keep(input.resourceBody.id, documents._getPartition(input.resourceBody));
      }
    }
    const results = [];
    let failed = -1;
    for (let i = 0; i < body.length && failed < 0; i += 1) {
      let result;
      try {
        result = run[body[i].operationType](collection, body[i]);
      } catch (err) {
        result = { statusCode: 400, body: { code: "BadRequest", message: err.message } };
      }
      results.push(result);
      if (result.statusCode >= 400) failed = i;
    }
    if (failed < 0) {
      return results.map(result => ({
        statusCode: result.statusCode,
        requestCharge: 1,
        eTag: result.body ? result.body._etag : undefined,
        resourceBody: result.body
      }));
    }
    for (const [id, partition] of before.values()) {
      if (documents._item("/id", id, partition).read()) documents.delete(id, partition);
    }
    for (const [, , data] of before.values()) {
      if (data) documents._set(data);
    }
    return body.map((_, i) =>
      i === failed
        ? { statusCode: results[i].statusCode, requestCharge: 0 }
        : { statusCode: 424, requestCharge: 0 }
    );
  };
  applied.push("batch-atomic");
}

// Bug 5: a query scoped to one partition (the SDK's query_items(..., partition_key=...),
// header x-ms-documentdb-partitionkey) or to a feed range (header
// x-ms-documentdb-partitionkeyrangeid) without the cross-partition flag answers 400
// "missing partition keys" unless the query text names the partition-key path, and
// where it runs, the header is ignored: items of every partition come back. In Cosmos
// such a query runs within that partition only. Run the package's query over the
// partition's documents. A feed range here is the one partition key range ("0", the
// whole container); a sub-range (x-ms-start-epk / x-ms-end-epk, e.g. from
// feed_range_from_partition_key) would need the effective-partition-key hash: refused
// with 400 rather than answered with the wrong items.
{
  const queryDocuments = lib("handler/query-documents");
  const readItems = lib("handler/_read-items").default;
  const json = lib("json");
  const pk = lib("utils/get-partition-from-header");
  const getValue = lib("utils/get-value").default;
  const original = queryDocuments.default;
  const sameKey = (wanted, actual) => {
    if (wanted !== null && typeof wanted === "object" && !Array.isArray(wanted) &&
        Object.keys(wanted).length === 0) {
      return actual === undefined; // the SDK's NonePartitionKeyValue: the path is absent
    }
    return actual !== undefined && JSON.stringify(actual) === JSON.stringify(wanted);
  };
  queryDocuments.default = async (account, req, res, params) => {
    const header = pk.default(req);
    const rangeId = req.headers["x-ms-documentdb-partitionkeyrangeid"];
    if (header === undefined && rangeId === undefined) {
      return original(account, req, res, params);
    }
    return readItems(req, res, "Documents", async ({ continuation, maxItemCount }) => {
      const body = await json.default(req);
      if (!body.query) {
        res.statusCode = 400;
        return { message: "missing query" };
      }
      const collection = account.database(params.dbId).collection(params.collId);
      const meta = collection.read();
      if (!meta) return null; // 404
      const documents = collection.documents;
      let scope = documents;
      if (header !== undefined) {
        let wanted;
        try {
          wanted = JSON.parse(header);
        } catch (err) {
          res.statusCode = 400;
          return { code: "BadRequest", message: `invalid partition key header ${header}` };
        }
        wanted = Array.isArray(wanted) ? wanted : [wanted];
        const paths = ((meta.partitionKey || {}).paths || ["/id"]).map(p => p.slice(1).split("/"));
        const inPartition = doc => wanted.every((value, i) => i < paths.length && sameKey(value, getValue(paths[i], doc)));
        const data = new Map([...documents._data].filter(([, item]) => inPartition(item.read())));
        // the package's own query code, over this partition's documents only
        scope = Object.create(documents, { _data: { value: data } });
      } else if (req.headers["x-ms-start-epk"] !== undefined || req.headers["x-ms-end-epk"] !== undefined) {
        res.statusCode = 400;
        return {
          code: "BadRequest",
          message: "the local Cosmos DB server does not serve queries on a part of a partition key range (x-ms-start-epk)"
        };
      }
      try {
        return scope.query(body, { continuation, maxItemCount });
      } catch (err) {
        if (err.badRequest) {
          res.statusCode = 400;
          return { message: err.message };
        }
        throw err;
      }
    });
  };
  applied.push("query-in-partition");
}

// Resource ids are plain base64, so from about the 63rd item of a container a `_rid`
// (and the `_self` link built from it) holds a '/', and the SDK's operations that
// take an item dict (delete_item(item), replace_item(item, ...) use `_self`) fail
// with "Failed Parsing ResourceID from link". Cosmos writes '-' for '/' in resource
// ids (the Python SDK's _base.py turns it back before decoding). Write '-' and read
// both (the package replaced only the first '-' when reading). Snapshots written
// before this keep their '/' rids: restore() renames them.
const ridWithoutSlash = rid => rid.replace(/\//g, "-");
{
  const ResourceId = lib("account/resource-id").default;
  ResourceId.toBase64String = buffer => ridWithoutSlash(buffer.toString("base64"));
  ResourceId.fromBase64String = s => Buffer.from(s.replace(/-/g, "/"), "base64");
  applied.push("rid-without-slash");
}

// A container's indexing policy comes back as {indexingMode: "consistent"} only when
// none was given (or without the paths when one was). Cosmos fills its default policy
// (https://learn.microsoft.com/azure/cosmos-db/index-policy): automatic, every path
// included, the _etag path excluded; with indexingMode "none", nothing. Fill each
// field that is missing, as a container is stored (created, replaced, loaded).
{
  const Collections = lib("account/collections").default;
  const set = Collections.prototype._set;
  Collections.prototype._set = function (data) {
    const policy = { ...(data.indexingPolicy || {}) };
    const mode = String(policy.indexingMode || "consistent").toLowerCase();
    const indexed = mode !== "none";
    const filled = {
      indexingMode: mode,
      automatic: indexed,
      includedPaths: indexed ? [{ path: "/*" }] : [],
      excludedPaths: indexed ? [{ path: '/"_etag"/?' }] : [],
      ...policy
    };
    return set.call(this, { ...data, indexingPolicy: filled });
  };
  applied.push("default-indexing-policy");
}

// Bug 11: every query is quadratic in the container's documents. The query
// compiler (@zeit/cosmosdb-query) turns `FROM c` into
// `$c.reduce(($, c) => ... [...$, { c: c }] ..., [])`, which copies the
// accumulated array once per document: about 1 s at 10,000 documents, 30 s at
// 40,000 (issue 44), whatever the filter or TOP. The same list is built with
// a filter and a map; other shapes (JOIN, subqueries) are left as compiled.
{
  const queryModule = require(require.resolve("@zeit/cosmosdb-query", {
    paths: [require.resolve(`${PKG}/package.json`)]
  }));
  const proto = Object.getPrototypeOf(queryModule.default("SELECT * FROM c"));
  const codeOf = Object.getOwnPropertyDescriptor(proto, "code");
  const quadraticFrom =
    /\$c\.reduce\(\(\$, (\w+)\) => typeof \1 !== "undefined" \? \[\.\.\.\$, \{\s*(\w+): \1\s*\}\] : \$, \[\]\)/g;
  Object.defineProperty(proto, "code", {
    configurable: true,
    get() {
      const code = codeOf.get.call(this);
      const linear = code.replace(
        quadraticFrom,
        (_, doc, alias) =>
          `$c.filter(${doc} => typeof ${doc} !== "undefined").map(${doc} => ({ ${alias}: ${doc} }))`
      );
      this._code = linear;
      return linear;
    }
  });
  applied.push("linear-from");
}

// A multi-property ORDER BY must match a composite index path by path and direction
// by direction (@zeit/cosmosdb-query's helpers.sort), so the exact reverse of an
// index (every direction flipped) answers 400. Cosmos serves it from the same index
// (https://learn.microsoft.com/azure/cosmos-db/index-policy#composite-indexes:
// (name ASC, age ASC) also serves ORDER BY name DESC, age DESC). Offer each index's
// reverse too.
{
  const queryHelpers = require(require.resolve("@zeit/cosmosdb-query/lib/helpers", {
    paths: [require.resolve(`${PKG}/package.json`)]
  }));
  const sort = queryHelpers.sort;
  const flip = order => (order === "descending" ? "ascending" : "descending");
  queryHelpers.sort = (collection, getRid, compositeIndexes, ...orders) => {
    const served = compositeIndexes && orders.length > 1
      ? compositeIndexes.concat(
          compositeIndexes.map(paths => paths.map(index => ({ ...index, order: flip(index.order) })))
        )
      : compositeIndexes;
    return sort(collection, getRid, served, ...orders);
  };
  applied.push("composite-index-reverse");
}

// --- persistence (--data-file) -------------------------------------------------------
//
// The package keeps everything in memory. With --data-file, the account's databases,
// containers (with their settings and rid counters), items and UDFs are written to that
// file (JSON, written to a temporary file and renamed, so a crash mid-write leaves the
// previous snapshot) within a second of any change and when the server stops, and
// loaded from it at start. Items keep their _rid, _etag and _ts, so etags held by
// clients stay valid across a restart. A kill -9 loses at most the last second.

const fs = require("fs");
let account = null;
{
  const accountModule = lib("account");
  const Original = accountModule.default;
  accountModule.default = class extends Original {
    constructor(...a) {
      super(...a);
      account = this; // the package keeps its account private; the snapshot needs it
    }
  };
}

const SNAPSHOT_VERSION = 1;
const values = items => [...items._data.values()].map(item => item.read());

function snapshot() {
  return {
    version: SNAPSHOT_VERSION,
    package: `${PKG} ${PINNED_VERSION}`,
    databaseRids: account.databases._ridCount,
    databases: [...account.databases._data.values()].map(db => ({
      data: db.read(),
      collectionRids: db.collections._ridCount,
      collections: [...db.collections._data.values()].map(coll => ({
        data: coll.read(),
        documentRids: coll.documents._ridCount,
        documents: values(coll.documents),
        udfRids: coll.userDefinedFunctions._ridCount,
        udfs: values(coll.userDefinedFunctions)
      }))
    }))
  };
}

// A snapshot from before rid-without-slash may hold rids with '/': rename them (and the
// _self links built from them), so its items work with the SDK like new ones.
function withRid(items, data) {
  const _rid = ridWithoutSlash(data._rid);
  return { ...data, _rid, _self: items._self(_rid) };
}

function restore(snap) {
  if (!snap || snap.version !== SNAPSHOT_VERSION) {
    throw new Error(`unknown snapshot version ${snap && snap.version}`);
  }
  let items = 0;
  for (const db of snap.databases) {
    account.databases._set(withRid(account.databases, db.data));
    const database = account.database(db.data.id);
    for (const coll of db.collections) {
      database.collections._set(withRid(database.collections, coll.data));
      const collection = database.collection(coll.data.id);
      for (const doc of coll.documents) {
        collection.documents._set(withRid(collection.documents, doc));
        items += 1;
      }
      for (const udf of coll.udfs) {
        collection.userDefinedFunctions._set(withRid(collection.userDefinedFunctions, udf));
        collection.userDefinedFunctions.functions[udf.id] = new Function(
          `"use strict";return (${udf.body})`
        )();
      }
      collection.documents._ridCount = coll.documentRids;
      collection.userDefinedFunctions._ridCount = coll.udfRids;
    }
    database.collections._ridCount = db.collectionRids;
  }
  account.databases._ridCount = snap.databaseRids;
  return { databases: snap.databases.length, items };
}

let dirty = false;
function save() {
  if (!args.dataFile || !account || !dirty) return;
  dirty = false;
  const tmp = `${args.dataFile}.tmp`;
  try {
    fs.writeFileSync(tmp, JSON.stringify(snapshot()));
    fs.renameSync(tmp, args.dataFile);
  } catch (err) {
    dirty = true;
    process.stderr.write(`cosmosdb launcher: cannot write ${args.dataFile}: ${err.message}\n`);
  }
}

function isMutation(req) {
  if (req.method === "GET" || req.method === "HEAD") return false;
  const isQuery =
    String(req.headers["x-ms-documentdb-isquery"] || "").toLowerCase() === "true" ||
    String(req.headers["content-type"] || "").startsWith("application/query+json");
  return !(req.method === "POST" && isQuery);
}

// --- fault injection -----------------------------------------------------------------
//
// Rules answer matching requests with an error instead of serving them, the way
// the service does under load. Set at start with --faults, or at run time with
//   PUT    /_devstack/faults   body [rule, ...]   (replaces the rules)
//   GET    /_devstack/faults   the rules and how often each fired
//   DELETE /_devstack/faults   no rules
// A rule: {"db": "name"?, "coll": "name"?, "docsOnly": bool?, "method": "GET"?,
//          "status": 429|503|408|..., "retryAfterMs": 100?, "fraction": 0..1?,
//          "count": N?}   (count: fire N times, then the rule is spent)
// The path /_devstack/ is not part of the Cosmos REST API, so the control
// endpoint can never be mistaken for a real one.

const FAULT_CODES = {
  408: ["RequestTimeout", 0],
  429: ["TooManyRequests", 3200],
  449: ["RetryWith", 0],
  500: ["InternalServerError", 0],
  503: ["ServiceUnavailable", 0]
};

let faultRules = [];

function setFaults(rules) {
  if (!Array.isArray(rules)) {
    throw new Error("faults must be a JSON array of rules");
  }
  faultRules = rules.map(rule => {
    if (typeof rule !== "object" || rule === null || !Number.isInteger(rule.status)) {
      throw new Error("each fault rule needs an integer status");
    }
    return { ...rule, fired: 0 };
  });
}

function pathParts(url) {
  let pathname = url.split("?")[0];
  while (pathname.startsWith("//")) {
    pathname = pathname.slice(1);
  }
  const parts = pathname.split("/").filter(Boolean).map(decodeURIComponent);
  const named = {};
  for (let i = 0; i + 1 < parts.length; i += 2) {
    named[parts[i]] = parts[i + 1];
  }
  return { named, parts };
}

function matchingFault(req) {
  const { named, parts } = pathParts(req.url);
  for (const rule of faultRules) {
    if (rule.count !== undefined && rule.count !== null && rule.fired >= rule.count) continue;
    if (rule.db && named.dbs !== rule.db) continue;
    if (rule.coll && named.colls !== rule.coll) continue;
    if (rule.docsOnly && !parts.includes("docs")) continue;
    if (rule.method && rule.method.toUpperCase() !== req.method) continue;
    if (rule.fraction !== undefined && Math.random() >= rule.fraction) continue;
    rule.fired += 1;
    return rule;
  }
  return null;
}

function sendJson(res, status, body, headers = {}) {
  res.statusCode = status;
  res.setHeader("content-type", "application/json");
  res.setHeader("x-ms-request-charge", "0");
  res.setHeader("x-ms-activity-id", require("crypto").randomUUID());
  for (const [name, value] of Object.entries(headers)) {
    res.setHeader(name, value);
  }
  res.end(JSON.stringify(body));
}

function controlFaults(req, res) {
  if (req.method === "GET") {
    sendJson(res, 200, { rules: faultRules });
    return;
  }
  if (req.method === "DELETE") {
    faultRules = [];
    sendJson(res, 200, { rules: [] });
    return;
  }
  if (req.method === "PUT" || req.method === "POST") {
    const chunks = [];
    req.on("data", chunk => chunks.push(chunk));
    req.on("end", () => {
      try {
        setFaults(JSON.parse(Buffer.concat(chunks).toString() || "[]"));
        sendJson(res, 200, { rules: faultRules });
      } catch (err) {
        sendJson(res, 400, { message: err.message });
      }
    });
    return;
  }
  sendJson(res, 405, { message: "use GET, PUT or DELETE" });
}

function injectFault(req, res, rule) {
  // Drain the body first so the client sees a clean response, as from the service.
  req.resume();
  req.on("end", () => {
    const [code, substatus] = FAULT_CODES[rule.status] || ["InjectedFault", 0];
    const headers = { "x-ms-substatus": String(substatus) };
    if (rule.retryAfterMs !== undefined) {
      headers["x-ms-retry-after-ms"] = String(rule.retryAfterMs);
    }
    sendJson(
      res,
      rule.status,
      { code, message: `fault injected by the dev stack (${code})` },
      headers
    );
  });
}

// --- server --------------------------------------------------------------------------

const args = parseArgs(process.argv.slice(2));
try {
  setFaults(args.faults);
} catch (err) {
  fail(`--faults: ${err.message}`);
}

const { createHttpsServer } = lib("index");
// keepAlive: the package closes every connection by default, which costs each
// request a TLS handshake (~45 ms with the sync client).
const server = createHttpsServer({ keepAlive: true });
// Outlive the clients' idle pools (aiohttp keeps idle connections 15 s) so a
// client never reuses a connection the server is closing at that instant.
server.keepAliveTimeout = 120000;
server.headersTimeout = 121000;
const [serveCosmos] = server.listeners("request");
server.removeAllListeners("request");

// Request counts by kind, for benchmarks: GET /_devstack/stats (DELETE resets).
// Kinds: read, create, replace, upsert, delete, query (item operations), other.
let stats = {};
function countRequest(req) {
  const path = req.url.split("?")[0];
  let kind = "other";
  if (/\/docs(\/|$)/.test(path)) {
    const isQuery = String(req.headers["x-ms-documentdb-isquery"] || "").toLowerCase() === "true" ||
      String(req.headers["content-type"] || "").startsWith("application/query+json");
    const upsert = String(req.headers["x-ms-documentdb-is-upsert"] || "").toLowerCase() === "true";
    kind = { GET: "read", PUT: "replace", DELETE: "delete", PATCH: "patch" }[req.method] ||
      (isQuery ? "query" : upsert ? "upsert" : "create");
  }
  stats[kind] = (stats[kind] || 0) + 1;
}
function controlStats(req, res) {
  if (req.method === "DELETE") stats = {};
  sendJson(res, 200, stats);
}

// A journal of document requests, for the cost bench (bench/host_cost.py), which
// prices each one by Azure's RU rules from the documents it touched: off until
// PUT /_devstack/journal; GET /_devstack/journal answers the entries so far and
// empties it; DELETE turns it off. An entry: method, path, status, the request's
// body (writes and batches) and the answer's (the stored document, a query's page).
let journal = null;
function parsed(buffer) {
  if (!buffer || !buffer.length) return null;
  try {
    return JSON.parse(buffer.toString());
  } catch (err) {
    return null;
  }
}
function journalRequest(req, res) {
  const path = req.url.split("?")[0];
  if (!/\/docs(\/|$)/.test(path)) return;
  const sent = [];
  const emit = req.emit;
  req.emit = function (event, chunk, ...rest) {
    if (event === "data") sent.push(chunk);
    return emit.call(this, event, chunk, ...rest);
  };
  const end = res.end;
  res.end = function (chunk, ...rest) {
    if (journal !== null) {
      journal.push({
        method: req.method,
        path,
        query: String(req.headers["x-ms-documentdb-isquery"] || "").toLowerCase() === "true" ||
          String(req.headers["content-type"] || "").startsWith("application/query+json"),
        upsert: String(req.headers["x-ms-documentdb-is-upsert"] || "").toLowerCase() === "true",
        status: res.statusCode,
        request: parsed(Buffer.concat(sent)),
        response: typeof chunk === "string" || Buffer.isBuffer(chunk) ? parsed(Buffer.from(chunk)) : null,
      });
    }
    return end.call(this, chunk, ...rest);
  };
}
function controlJournal(req, res) {
  if (req.method === "PUT") journal = journal || [];
  if (req.method === "DELETE") journal = null;
  const entries = journal || [];
  if (journal !== null) journal = [];
  sendJson(res, 200, entries);
}

server.on("request", (req, res) => {
  const route = req.url.split("?")[0].replace(/^\/+/, "/");
  if (route === "/_devstack/faults") {
    controlFaults(req, res);
    return;
  }
  if (route === "/_devstack/stats") {
    controlStats(req, res);
    return;
  }
  if (route === "/_devstack/journal") {
    controlJournal(req, res);
    return;
  }
  countRequest(req);
  if (journal !== null) journalRequest(req, res);
  if (args.dataFile && isMutation(req)) {
    // after the handler has run: the change is in memory once the response is written
    res.on("finish", () => {
      dirty = true;
    });
  }
  const rule = faultRules.length ? matchingFault(req) : null;
  if (rule) {
    injectFault(req, res, rule);
    return;
  }
  serveCosmos(req, res);
});

server.on("error", err => fail(err.message));
server.listen(args.port, args.host, () => {
  const { port } = server.address();
  const host = args.host.includes(":") ? `[${args.host}]` : args.host;
  let kept = "data: memory only";
  if (args.dataFile) {
    fs.mkdirSync(require("path").dirname(args.dataFile), { recursive: true });
    if (fs.existsSync(args.dataFile)) {
      let counts;
      try {
        counts = restore(JSON.parse(fs.readFileSync(args.dataFile, "utf8")));
      } catch (err) {
        fail(`cannot load ${args.dataFile} (${err.message}); move it away to start empty`);
      }
      kept = `data: ${args.dataFile} (loaded ${counts.databases} databases, ${counts.items} items)`;
    } else {
      kept = `data: ${args.dataFile} (new)`;
    }
    setInterval(save, 1000).unref();
  }
  process.stdout.write(
    `cosmosdb-server ready at https://${host}:${port}/ ` +
      `(${PKG} ${pkgJson.version}, pid ${process.pid}, patches: ${applied.join(", ")}; ${kept})\n`
  );
});

// Idle keep-alive connections would hold close(): write the snapshot and leave.
const stop = () => {
  save();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);

// A test run that is killed outright cannot stop us: leave with our parent.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) stop();
}, 1000).unref();
