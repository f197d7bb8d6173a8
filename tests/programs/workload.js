// Node.js workload for the LD_PRELOAD tests: Buffers (allocated outside the V8 heap) and many small objects.
'use strict';
const zlib = require('zlib');

let bufferBytes = 0;
let firstBytes = 0;
const kept = [];
for (let i = 0; i < 20000; i++) {
  const b = Buffer.alloc(100 + (i % 5000), i & 0xff);
  bufferBytes += b.length;
  firstBytes += b[0];
  if (i % 3 === 0) kept.push(b);
}
// Large buffers, then a zlib round trip (native state from malloc).
let large = 0;
for (let i = 1; i <= 20; i++) {
  large += Buffer.allocUnsafe(i * 100000).fill(1).length;
}
const plain = Buffer.from('mallard '.repeat(100000));
const back = zlib.inflateSync(zlib.deflateSync(plain));
if (!back.equals(plain)) throw new Error('zlib round trip lost data');

const objects = {};
for (let i = 0; i < 100000; i++) objects['k' + i] = { v: i, s: 'x'.repeat(i % 50) };
let strBytes = 0;
for (const k of Object.keys(objects)) strBytes += objects[k].s.length;
console.log(`buffers=${bufferBytes} first=${firstBytes} kept=${kept.length} large=${large} ` +
            `zlib=${back.length} objects=${Object.keys(objects).length} str=${strBytes}`);
