/**
 * Redis time per call of the decide script's usual call (one bucket, a take), two builds of the script
 * side by side on a redis-server of its own: `node bench/script-compare.mjs <commit> [<commit>]` (the
 * second defaults to the working tree). Each script is read from libs/rate-limit/src/stores/redis/lua/
 * lua-sources.generated.ts of its commit. Rounds alternate between the two; per round, CONFIG RESETSTAT,
 * then CALLS EVALSHA in pipelines of 100 over KEYS keys, then INFO commandstats' usec_per_call. Prints
 * each round and the median ratio. A measurement, not a test: the machine's other load moves it.
 */
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { Redis } from 'ioredis';

const [base, candidate = '.'] = process.argv.slice(2);
const ROUNDS = Number(process.env.ROUNDS ?? 8);
const CALLS = Number(process.env.CALLS ?? 50_000);
const KEYS = 1_000;
const FILE = 'libs/rate-limit/src/stores/redis/lua/lua-sources.generated.ts';

function decideOf(side) {
  const text =
    side === '.' ? readFileSync(FILE, 'utf8') : execFileSync('git', ['show', `${side}:${FILE}`], { encoding: 'utf8', maxBuffer: 1 << 26 });
  const match = /export const DECIDE_LUA = (".*");$/m.exec(text);
  if (!match) throw new Error(`no DECIDE_LUA in ${side}`);
  return JSON.parse(match[1]);
}

const port = await new Promise((resolve) => {
  const server = createServer().listen(0, '127.0.0.1', () => {
    const { port: free } = server.address();
    server.close(() => resolve(free));
  });
});
const child = spawn('redis-server', ['--port', String(port), '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
const redis = new Redis({ port, lazyConnect: true });
for (let i = 0; i < 50; i++) {
  try {
    await redis.connect();
    break;
  } catch {
    await new Promise((r) => setTimeout(r, 100));
  }
}
const sides = [base, candidate].map((side) => ({ side, lua: decideOf(side) }));
for (const s of sides) s.sha = await redis.script('LOAD', s.lua);

async function round(s, r) {
  await redis.config('RESETSTAT');
  for (let done = 0; done < CALLS; done += 100) {
    const pipeline = redis.pipeline();
    for (let i = 0; i < 100; i++) pipeline.evalsha(s.sha, 1, `bench:{${s.side}}:${(done + i) % KEYS}`, 8, 1e9, 1e6, 1);
    await pipeline.exec();
  }
  const info = await redis.info('commandstats');
  const usec = Number(/cmdstat_evalsha:calls=\d+,usec=\d+,usec_per_call=([\d.]+)/.exec(info)[1]);
  console.log(`round ${r + 1} ${s.side}: ${usec} µs per call`);
  return usec;
}

const per = sides.map(() => []);
for (let r = 0; r < ROUNDS; r++) {
  const order = r % 2 === 0 ? [0, 1] : [1, 0];
  for (const i of order) per[i].push(await round(sides[i], r));
}
const median = (values) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)];
const ratios = per[1].map((value, r) => value / per[0][r]);
console.log(
  `${sides[0].side}: ${median(per[0])} µs, ${sides[1].side}: ${median(per[1])} µs; ratio per round, median ${median(ratios).toFixed(3)} ` +
    `(${Math.min(...ratios).toFixed(3)}-${Math.max(...ratios).toFixed(3)})`,
);
redis.disconnect();
child.kill();
