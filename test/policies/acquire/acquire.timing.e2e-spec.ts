import type { ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Injectable, Module } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, Paced, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { killChild, spawnChild } from '../../support/children.js';
import { RedisServer, redisUrl } from '../../support/redis.js';
import { redisScenario } from '../../support/scenario.js';

/**
 * Issue 23, what takes a clock: four processes sharing one bucket through acquire() (FIFO, the bound
 * B + R·t in every window, each caller on time), failureMode while Redis is dead, a late reply given
 * back, and @Paced at its pace. A run whose event loop stalled beyond LOOP_LIMIT_MS is inconclusive and
 * is run once more; a second inconclusive run fails.
 */
const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const CHILD = fileURLToPath(new URL('./acquire-child.ts', import.meta.url));
const LOOP_LIMIT_MS = 15;

interface Call {
  go: number;
  waitedMs: number;
  scheduledWaitMs: number;
}

/**
 * The child and the library sources it imports, transpiled once into dist/test-acquire/<random>/ (inside
 * the repository, so that bare imports resolve from its node_modules): four processes that each load
 * TypeScript to transpile them took 10 s on two cores; this takes about one. The child builds its
 * BucketService by hand, so no decorator metadata is needed.
 */
async function buildChild(): Promise<{ entry: string; remove: () => Promise<void> }> {
  const ts = (await import('typescript')).default;
  const out = join(ROOT, 'dist', 'test-acquire', randomUUID().slice(0, 8));
  const pending = [CHILD];
  const seen = new Set<string>();
  while (pending.length > 0) {
    const file = pending.pop()!;
    if (seen.has(file)) continue;
    seen.add(file);
    const source = readFileSync(file, 'utf8');
    for (const [, spec] of source.matchAll(/(?:from|import) '(\.{1,2}\/[^']+)\.js'/g)) pending.push(resolve(dirname(file), `${spec}.ts`));
    const { outputText } = ts.transpileModule(source, {
      fileName: file,
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022, experimentalDecorators: true },
    });
    const target = join(out, relative(ROOT, file)).replace(/\.ts$/, '.js');
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, outputText);
  }
  writeFileSync(join(out, 'package.json'), '{ "type": "module" }');
  return { entry: join(out, relative(ROOT, CHILD)).replace(/\.ts$/, '.js'), remove: () => rm(out, { recursive: true, force: true }) };
}

let childEntry = '';

function startChild(url: string, name: string): Promise<{ child: ChildProcess; result: Promise<{ calls: Call[]; loopDelayMs: number }> }> {
  const child = spawnChild(process.execPath, [childEntry, url, name, '50', '5', '100'], {
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, NODE_OPTIONS: '' },
  });
  const lines = createInterface({ input: child.stdout! });
  let ready: () => void;
  const isReady = new Promise<void>((resolve) => (ready = resolve));
  const result = new Promise<{ calls: Call[]; loopDelayMs: number }>((resolve, reject) => {
    lines.on('line', (line) => (line === 'ready' ? ready() : resolve(JSON.parse(line))));
    child.once('exit', (code) => reject(new Error(`acquire child exited with ${code}`)));
  });
  result.catch(() => undefined);
  return isReady.then(() => ({ child, result }));
}

/** One run of 4 × 50 acquires on B = 5, R = 100/s; undefined when a process's loop stalled (inconclusive). */
async function fairnessRun(url: string, name: string): Promise<Call[][] | undefined> {
  const children = await Promise.all([0, 1, 2, 3].map(() => startChild(url, name)));
  try {
    for (const { child } of children) child.stdin!.write('go\n');
    const results = await Promise.all(children.map(({ result }) => result));
    if (results.some((r) => r.loopDelayMs > LOOP_LIMIT_MS)) {
      console.warn(`acquire fairness: inconclusive, loop delays ${results.map((r) => r.loopDelayMs.toFixed(1)).join(', ')} ms`);
      return undefined;
    }
    return results.map((r) => r.calls);
  } finally {
    await Promise.all(children.map(({ child }) => killChild(child)));
  }
}

describe('acquire() across four processes', () => {
  const scenario = redisScenario('acquire-timing');
  let build: { entry: string; remove: () => Promise<void> } | undefined;

  beforeAll(async () => {
    build = await buildChild();
    childEntry = build.entry;
  });

  afterAll(() => build?.remove());

  it('grants 200 acquires of 4 processes on B = 5, R = 100/s in 1.95-2.3 s, never over 5 + 100·t (+ lateness, +1), each at most 25 ms after its announced turn', async () => {
    const url = await redisUrl();
    let perProcess: Call[][] | undefined;
    for (let attempt = 0; attempt < 2 && perProcess === undefined; attempt++) {
      perProcess = await fairnessRun(url, `${scenario.prefix}fair:${attempt}`);
    }
    if (perProcess === undefined) throw new Error('acquire fairness: inconclusive twice (the machine is too loaded to judge)');
    const calls = perProcess.flat();
    expect(calls).toHaveLength(200);
    const go = calls.map((c) => c.go).sort((a, b) => a - b);
    // From the first call made (its go time less the time it took) to the last grant.
    const start = Math.min(...calls.map((c) => c.go - c.waitedMs));
    const span = (go[199] - start) / 1000;
    expect(span).toBeGreaterThanOrEqual(1.95);
    expect(span).toBeLessThanOrEqual(2.3);
    // Late by the round trip and the timer at most: waitedMs beyond the announced wait bounds how long
    // after its turn (Redis' decision time + the wait) a caller went, as the call was sent before Redis decided.
    // That bound also counts the time a request queued at Redis behind the burst of 200 (10-15 ms here,
    // before its turn was computed), so it is held to 25 ms; the timer itself is late by 1-2 ms.
    const late = Math.max(...calls.map((c) => c.waitedMs - c.scheduledWaitMs));
    expect(late).toBeLessThanOrEqual(25);
    // Any window [go[i], go[j]]: j - i + 1 grants in (go[j] - go[i]) / 1000 s. Go times are turns plus up to
    // `late` ms (a process whose reply came sooner goes sooner after its turn), so the turns inside a window
    // of go times span at most `late` ms more: 5 + 100·(t + late) grants, +1 for a timer's jitter.
    let worst = -Infinity;
    for (let i = 0; i < go.length; i++) {
      for (let j = i; j < go.length; j++) worst = Math.max(worst, j - i + 1 - (5 + (100 * (go[j] - go[i])) / 1000));
    }
    expect(worst).toBeLessThanOrEqual((100 * late) / 1000 + 1);
    // Every process was served: 50 grants each (turns go by arrival at Redis, so a process that sent later waits longer).
    for (const own of perProcess) expect(own).toHaveLength(50);
  }, 30_000);
});

describe('acquire() while Redis fails', () => {
  let server: RedisServer;
  const modules: TestingModule[] = [];

  beforeAll(async () => {
    server = await RedisServer.start();
  });

  afterAll(async () => {
    await Promise.all(modules.map((m) => m.close()));
    await server?.stop();
  });

  async function serviceOn(extra: Record<string, unknown>): Promise<BucketService> {
    const moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: server.url, timeoutMs: 100, ...extra })],
    }).compile();
    moduleRef.useLogger(false);
    await moduleRef.init();
    modules.push(moduleRef);
    return moduleRef.get(BucketService);
  }

  it('gives back a reservation whose reply came after the timeout', async () => {
    const buckets = await serviceOn({ failureMode: 'open', keyPrefix: 'late:' });
    const admin = new Redis(server.url);
    try {
      await buckets.acquire('late', { capacity: 3, refillPerSecond: 0.01 });
      server.signal('SIGSTOP');
      const started = performance.now();
      const decision = await buckets.acquire('late', { capacity: 3, refillPerSecond: 0.01 });
      // 'open': through at once, after the deadline.
      expect(performance.now() - started).toBeLessThan(100 + 200);
      expect(decision.scheduledWaitMs).toBe(0);
      server.signal('SIGCONT');
      // The late reply reserved a token; the refund gives it back: 2 tokens left (one acquired before), not 1.
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(Number(await admin.hget('late:{late}', 'tokens'))).toBeCloseTo(2, 2);
    } finally {
      server.signal('SIGCONT');
      await admin.quit();
    }
  });

  it("answers within timeoutMs + 200 ms while Redis is dead: 'open' goes, 'closed' rejects, 'local' waits its turn in process", async () => {
    const open = await serviceOn({ failureMode: 'open', keyPrefix: 'dead:' });
    const closed = await serviceOn({ failureMode: 'closed', keyPrefix: 'dead:' });
    await server.stop('SIGKILL');
    const policy = { capacity: 1, refillPerSecond: 5 };
    let started = performance.now();
    expect(await open.acquire('dead', policy)).toMatchObject({ allowed: true, scheduledWaitMs: 0 });
    expect(performance.now() - started).toBeLessThan(300);
    started = performance.now();
    await expect(closed.acquire('dead', policy)).rejects.toBeInstanceOf(RateLimitUnavailableError);
    expect(performance.now() - started).toBeLessThan(300);
    // The call's own failureMode: 'local' on the 'open' module, one token then 200 ms per token in process.
    started = performance.now();
    const [first, second] = await Promise.all([
      open.acquire('dead', policy, { failureMode: 'local' }),
      open.acquire('dead', policy, { failureMode: 'local' }),
    ]);
    expect(first.scheduledWaitMs).toBe(0);
    expect(second.scheduledWaitMs).toBeGreaterThan(150);
    expect(second.scheduledWaitMs).toBeLessThanOrEqual(200);
    expect(performance.now() - started).toBeLessThan(300 + 200);
  });
});

describe('@Paced at its pace', () => {
  const scenario = redisScenario('acquire-paced');

  it('runs 12 calls of a provider method at capacity 2, 10/s: the last after about 1 s, never ahead of 2 + 10·t', async () => {
    const runs: number[] = [];
    @Injectable()
    class Outbound {
      @Paced({ name: 'outbound', capacity: 2, refillPerSecond: 10 })
      async call(): Promise<void> {
        runs.push(performance.now());
      }
    }
    @Module({ providers: [Outbound] })
    class OutboundModule {}
    const moduleRef = scenario.track(
      await Test.createTestingModule({
        imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: scenario.nextKeyPrefix() }), OutboundModule],
      })
        .compile()
        .then((m) => m.createNestApplication({ logger: false })),
    );
    await moduleRef.init();
    const outbound = moduleRef.get(Outbound);
    const started = performance.now();
    await Promise.all(Array.from({ length: 12 }, () => outbound.call()));
    runs.sort((a, b) => a - b);
    expect(runs[11] - started).toBeGreaterThanOrEqual(1000 - 2);
    expect(runs[11] - started).toBeLessThan(1200);
    for (let i = 0; i < runs.length; i++) {
      for (let j = i; j < runs.length; j++) expect(j - i + 1).toBeLessThanOrEqual(2 + (10 * (runs[j] - runs[i])) / 1000 + 1);
    }
  });
});
