/**
 * Where a concurrency slot's Redis instructions go (issue 36, item 4): `node bench/slot-breakdown.mjs`
 * (about 4 minutes; needs valgrind). A redis-server of its own under `valgrind --tool=callgrind
 * --instr-atstart=no`, one call at a time from one ioredis client; the slot scripts are read from this
 * tree's libs/rate-limit/src/stores/redis/lua/lua-sources.generated.ts. Per operation: a warm-up of 300,
 * then 3 segments of N (1,000), each zeroed and dumped; instructions per operation = the median segment's
 * total / N less the server's idle instructions over as long (measured in 2 s without calls). Parts:
 * a script call that does nothing, TIME, HMGET and PTTL inside a script, PING and a plain HDEL; pairs of
 * take + give back on a key with 49 other slots held, with slot-take.lua as it is, with its PTTL replaced
 * by an unconditional PEXPIRE, and with the key's expiry left out (neither is correct: a comparison); then
 * takes, give-backs, give-backs of a missing holder and plain HDELs measured apart, in segments of 60 (the
 * hash grows by 60 slots during the takes). A measurement, not a test.
 */
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';

const N = Number(process.env.N ?? 1_000);
const APART = 60;
const LIMIT = 1_000;
const LIFE = 30_000;
const FILE = 'libs/rate-limit/src/stores/redis/lua/lua-sources.generated.ts';
const source = readFileSync(FILE, 'utf8');
const lua = (name) => JSON.parse(new RegExp(`export const ${name} = (".*");$`, 'm').exec(source)[1]);
const TAKE = lua('SLOT_TAKE_LUA');
const KEEP = "local ttl = call('PTTL', key)\n  if ttl < life then call('PEXPIRE', key, life) end";
if (!TAKE.includes(KEEP)) throw new Error("slot-take.lua's keep() is not the one this breakdown replaces");

const dir = join(tmpdir(), `slot-breakdown-${process.pid}`);
rmSync(dir, { recursive: true, force: true });
mkdirSync(dir, { recursive: true });
const port = await new Promise((done) => {
  const server = createServer().listen(0, '127.0.0.1', () => {
    const { port: free } = server.address();
    server.close(() => done(free));
  });
});
const out = join(dir, 'callgrind.out');
const valgrind = ['--tool=callgrind', '--instr-atstart=no', `--callgrind-out-file=${out}`, `--log-file=${join(dir, 'valgrind.log')}`];
const child = spawn('valgrind', [...valgrind, 'redis-server', '--port', String(port), '--save', '', '--appendonly', 'no', '--dir', dir], {
  stdio: 'ignore',
});
const redis = new Redis({ port, retryStrategy: () => 500 });
redis.on('error', () => undefined);
try {
  for (let i = 0; ; i++) {
    try {
      await redis.ping();
      break;
    } catch (error) {
      if (i > 240) throw error;
      await sleep(500);
    }
  }
  const control = (...flags) => execFileSync('callgrind_control', [...flags, String(child.pid)]);
  let dumps = 0;
  const total = () => Number(/^(?:totals|summary):\s+(\d+)/m.exec(readFileSync(`${out}.${++dumps}`, 'utf8'))[1]);
  const sha = {};
  for (const [name, body] of Object.entries({
    take: TAKE,
    'take-pexpire': TAKE.replace(KEEP, "call('PEXPIRE', key, life)"),
    'take-no-expiry': TAKE.replace(KEEP, ''),
    give: lua('SLOT_GIVE_BACK_LUA'),
    nothing: 'return 1',
    time: "return redis.call('TIME')",
    hmget: "return redis.call('HMGET', KEYS[1], 'n', 'e', 's:x')",
    pttl: "return redis.call('PTTL', KEYS[1])",
  }))
    sha[name] = await redis.script('LOAD', body);
  let holder = 0;
  for (const key of ['busy', 'busy-pexpire', 'busy-no-expiry'])
    for (let i = 0; i < 49; i++) await redis.evalsha(sha.take, 1, key, LIMIT, `other-${i}`, 3_600_000);
  const pair = (take, key) => async () => {
    const id = `h${holder++}`;
    await redis.evalsha(sha[take], 1, key, LIMIT, id, LIFE);
    await redis.evalsha(sha.give, 1, key, id);
  };
  control('-i', 'on');
  let idle = 0;
  const segment = async (count, once) => {
    control('-z');
    const start = performance.now();
    for (let i = 0; i < count; i++) await once(i);
    const seconds = (performance.now() - start) / 1000;
    control('-d');
    return Math.round((total() - idle * seconds) / count);
  };
  control('-z');
  const idleStart = performance.now();
  await sleep(2_000);
  control('-d');
  idle = total() / ((performance.now() - idleStart) / 1000);
  console.log(`idle: ${Math.round(idle).toLocaleString('en-US')} instructions/s`);
  const middle = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
  const show = (name, values) =>
    console.log(`${name.padEnd(58)} ${middle(values).toLocaleString('en-US').padStart(9)}   (${values.join(', ')})`);
  const operations = {
    'EVALSHA of a script that does nothing': () => redis.evalsha(sha.nothing, 1, 'busy'),
    "EVALSHA of redis.call('TIME')": () => redis.evalsha(sha.time, 1, 'busy'),
    "EVALSHA of redis.call('HMGET', 3 fields), 49 slots": () => redis.evalsha(sha.hmget, 1, 'busy'),
    "EVALSHA of redis.call('PTTL')": () => redis.evalsha(sha.pttl, 1, 'busy'),
    PING: () => redis.ping(),
    'HDEL of a missing field (a plain command), 49 slots': (i) => redis.hdel('busy', `missing-${i}`),
    'take + give back, 49 slots': pair('take', 'busy'),
    'the same, PTTL + PEXPIRE replaced by PEXPIRE': pair('take-pexpire', 'busy-pexpire'),
    'the same, no expiry': pair('take-no-expiry', 'busy-no-expiry'),
  };
  // Each right after its own warm-up: a key whose TTL a variant cut to 30 s must not expire in between.
  for (const [name, once] of Object.entries(operations)) {
    for (let i = 0; i < 300; i++) await once(i);
    const values = [];
    for (let s = 0; s < 3; s++) values.push(await segment(N, once));
    show(name, values);
  }
  const apart = { 'take, 49 → 109 slots': [], 'give back, 109 → 49 slots': [], 'give back of a missing holder': [], 'plain HDEL': [] };
  for (let s = 0; s < 5; s++) {
    const ids = Array.from({ length: APART }, () => `h${holder++}`);
    apart['take, 49 → 109 slots'].push(await segment(APART, (i) => redis.evalsha(sha.take, 1, 'busy', LIMIT, ids[i], LIFE)));
    apart['give back, 109 → 49 slots'].push(await segment(APART, (i) => redis.evalsha(sha.give, 1, 'busy', ids[i])));
    apart['give back of a missing holder'].push(await segment(APART, (i) => redis.evalsha(sha.give, 1, 'busy', `missing-${i}`)));
    apart['plain HDEL'].push(await segment(APART, (i) => redis.hdel('busy', `missing-${i}`)));
  }
  for (const [name, values] of Object.entries(apart)) show(`apart (segments of ${APART}): ${name}`, values);
} finally {
  redis.disconnect();
  child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
}
