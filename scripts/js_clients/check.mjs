// The checks behind docs/TYPES.md, "Reading the JSON in clients":
//   cd scripts/js_clients && npm install && node check.mjs
// Exits 1 when a library no longer behaves as the docs say.
import assert from 'node:assert/strict';
import jsonpatch from 'fast-json-patch';
import JSONbig from 'json-bigint';
import { parse, stringify } from 'lossless-json';
import * as rfc6902 from 'rfc6902';

// Messages as the sidecar publishes them: an insert (root replace), an update, a delete.
const insert = '{"seq":1,"op":"I","patch":[{"op":"replace","path":"","value":' +
  '{"id":9007199254740993,"doc":{"pi":3.141592653589793238462643383279,"d":12345678901234567.89,"e":1e400}}}]}';
const update = '{"seq":2,"op":"U","patch":[{"op":"replace","path":"/id","value":9007199254740995}]}';
const remove = '{"seq":3,"op":"D","patch":[{"op":"replace","path":"","value":null}]}';
const exact = '{"id":9007199254740995,"doc":{"pi":3.141592653589793238462643383279,"d":12345678901234567.89,"e":1e400}}';

// JSON.parse rounds
const plain = JSON.parse(insert).patch[0].value;
assert.equal(String(plain.id), '9007199254740992');
assert.equal(plain.doc.e, Infinity);
console.log('JSON.parse: 9007199254740993 -> 9007199254740992, 1e400 -> Infinity');

// lossless-json + fast-json-patch (mutating, the default) keep every digit
let doc = null;
doc = jsonpatch.applyPatch(doc, parse(insert).patch).newDocument;
doc = jsonpatch.applyPatch(doc, parse(update).patch).newDocument;
assert.equal(stringify(doc), exact);
doc = jsonpatch.applyPatch(doc, parse(remove).patch).newDocument;
assert.equal(doc, null);
console.log('lossless-json + fast-json-patch: insert, update, delete applied, every digit kept');

// json-bigint: big integers and long decimals, but not 1e400
const big = JSONbig({ storeAsString: true }).parse('{"a":9007199254740993,"b":12345678901234567.89}');
assert.deepEqual({ ...big }, { a: '9007199254740993', b: '12345678901234567.89' });
assert.throws(() => JSONbig.parse('{"e":1e400}'), (e) => e.message === 'Bad number');
console.log('json-bigint: big integers and decimals kept; 1e400 throws "Bad number"');

// rfc6902 refuses every root replace
for (const start of [null, {}, { id: 1 }]) {
  const results = rfc6902.applyPatch(start, [{ op: 'replace', path: '', value: { id: 2 } }]);
  assert.equal(results[0]?.name, 'MissingError');
}
const updated = { id: 1 };
assert.deepEqual(rfc6902.applyPatch(updated, [{ op: 'replace', path: '/id', value: 2 }]), [null]);
assert.deepEqual(updated, { id: 2 });
console.log('rfc6902: updates applied; every root replace fails with MissingError');

// depth
const deep = '['.repeat(1000) + ']'.repeat(1000);
JSON.parse(deep);
parse(deep);
console.log('JSON.parse and lossless-json: 1000 levels read');
