import { performance } from 'node:perf_hooks';
import { Logger } from '@nestjs/common';
import type { Redis, RedisOptions } from 'ioredis';
import { sleep } from '../../support/load.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { MuteProxy } from '../../support/mute-proxy.js';
import { LocalSentinels, MASTER_NAME } from '../../support/sentinel.js';
// Not public: the module's own client for `redis: { sentinels, name }`, and what it adds to it.
import { createRedisClient } from '../../../libs/rate-limit/src/stores/redis/redis-client.js';
import { ownedConnectionOf } from '../../../libs/rate-limit/src/stores/redis/owned-connection.js';
import { HoldProxy } from './hold-proxy.js';

/**
 * A client the module creates for `redis: { sentinels, name }`, waiting out a reconnect back-off, is
 * woken (docs/guides/redis-sentinel.md, "The bound"): it reconnects at once, not when ioredis' timer
 * says, when
 * - Sentinel's switch came while a reconnect attempt was under way, which had looked up the old master
 *   just before it (the attempt fails after the switch, then waits out the back-off): `switch`;
 * - the app hears no switch (its subscriptions silently dead) but a lookup names the new master: `unheard`;
 * - no replica can be promoted and the same master comes back: it answers again: `comeback`.
 * Each on a deployment of its own (test/support/sentinel.ts), with a back-off made long by the client's
 * `retryStrategy` (a user option), so that waiting it out misses the bound by seconds: without the
 * wake-up each scenario takes 2.5–5 s, with it a few hundred ms.
 */

/** What the guide promises: decisions on the new master within this of Sentinel's switch (or of the master answering again). */
const BOUND_MS = 1000;

type Scenario = 'switch' | 'unheard' | 'comeback';
const SCENARIOS: Scenario[] = ['switch', 'unheard', 'comeback'];

/** 'switch': the first retry comes this long after the kill (before Sentinel can switch), the next ones after BACKOFF_MS. */
const FIRST_RETRY_MS = 800;
const BACKOFF_MS = { switch: 4000, unheard: 5000, comeback: 8000 };
/** 'switch': the held lookup's answer (the old master) is delivered this long after the switch. */
const RELEASE_AFTER_SWITCH_MS = 100;

interface Outcome {
  /** From the switch ('switch', 'unheard') or the master answering again ('comeback') to the client ready on the master. */
  recoveryMs: number;
  /** The master the client is ready on at the end, and the one it was on before the fault. */
  readyOn: number;
  oldPort: number;
  lines: string[];
  target: string;
}

/** Every client logs here (Nest's Logger is one for the process): lines are told apart by the sentinels' addresses. */
const recorder = new LogRecorder();

async function waitFor<T>(what: string, check: () => T | undefined, timeoutMs: number): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = check();
    if (value !== undefined) return value;
    if (performance.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await sleep(10);
  }
}

/** The port of the client's connection when it is ready, else undefined. */
function readyPort(client: Redis): number | undefined {
  const stream = (client as unknown as { stream?: { remotePort?: number } }).stream;
  return client.status === 'ready' ? stream?.remotePort : undefined;
}

/** One run of `scenario`: its outcome, or why it cannot be judged. */
async function attempt(scenario: Scenario): Promise<Outcome | string> {
  const d = await LocalSentinels.start();
  const holds = scenario === 'switch' ? await Promise.all(d.sentinels.map((s) => HoldProxy.start(s.port))) : [];
  const mutes = scenario === 'unheard' ? await Promise.all(d.sentinels.map((s) => MuteProxy.start(s.port))) : [];
  const proxies = [...holds, ...mutes];
  const events = d.watch();
  let client: Redis | undefined;
  try {
    const sentinels = proxies.length > 0 ? proxies.map((p) => ({ host: '127.0.0.1', port: p.port })) : d.options.sentinels;
    const options: RedisOptions = {
      ...d.options,
      sentinels,
      retryStrategy: (times) => (scenario === 'switch' && times === 1 ? FIRST_RETRY_MS : BACKOFF_MS[scenario]),
      // 'switch': the held lookup waits for its answer (the default, 1000 ms, would ask the next sentinel),
      // and the client knows only the relays (ioredis would add the sentinels' own addresses after a lookup).
      ...(scenario === 'switch' ? { sentinelCommandTimeout: 10_000, updateSentinels: false } : {}),
    };
    const created = createRedisClient(options);
    client = created.client as Redis;
    const target = `via sentinels 127.0.0.1:${sentinels[0].port},`;
    ownedConnectionOf(client)!.start();
    await client.connect();
    const oldPort = d.master.port;
    if (readyPort(client) !== oldPort) return `the client is on ${readyPort(client)}, not the master ${oldPort}`;

    if (scenario === 'comeback') {
      // No replica to promote: it is down, and the sentinels know it before the master dies.
      d.replica.signal('SIGKILL');
      await waitFor('the sentinels see the replica down', () => events.seen.get('+sdown'), 10_000);
    }
    for (const hold of holds) hold.hold();
    for (const mute of mutes) mute.mute();
    const killedAt = performance.now();
    d.master.signal('SIGKILL');

    let from: number;
    let readyOn: number;
    if (scenario === 'comeback') {
      await waitFor('Sentinel gives up the failover', () => events.seen.get('-failover-abort-no-good-slave'), 15_000);
      from = await d.master.restart();
      if (from - killedAt > BACKOFF_MS.comeback - BOUND_MS - 500)
        return `the master answered ${(from - killedAt).toFixed(0)} ms after the kill`;
      readyOn = await waitFor('the client ready on the master again', () => readyPort(client!), 15_000);
    } else {
      from = await waitFor("Sentinel's switch", () => events.seen.get('+switch-master'), 15_000);
      const switchMs = from - killedAt;
      // The first retry's lookup must reach a sentinel before the switch, and the back-off after it must miss the bound.
      if (scenario === 'switch' && switchMs < FIRST_RETRY_MS + 300) return `Sentinel switched ${switchMs.toFixed(0)} ms after the kill`;
      if (scenario === 'unheard' && BACKOFF_MS.unheard - switchMs < BOUND_MS + 500)
        return `Sentinel switched ${switchMs.toFixed(0)} ms after the kill`;
      if (scenario === 'switch') {
        await sleep(RELEASE_AFTER_SWITCH_MS);
        if (!holds.some((h) => h.heldLookups.some((at) => at < from))) return 'no lookup reached a sentinel before the switch';
        for (const hold of holds) hold.release();
      }
      readyOn = await waitFor(
        'the client ready on another master',
        () => {
          const port = readyPort(client!);
          return port !== undefined && port !== oldPort ? port : undefined;
        },
        15_000,
      );
    }
    const recoveryMs = performance.now() - from;
    process.stdout.write(
      `[figure] ${scenario}: ready on ${readyOn} ${recoveryMs.toFixed(0)} ms after ${scenario === 'comeback' ? 'the master answered' : 'the switch'}\n`,
    );
    const lines = recorder.lines
      .filter((l) => l.context === 'RateLimit' && l.message.includes(target))
      .map((l) => `${l.level}: ${l.message}`);
    return { recoveryMs, readyOn, oldPort, lines, target };
  } finally {
    if (client) {
      ownedConnectionOf(client)?.stop();
      client.disconnect();
    }
    events.stop();
    await Promise.all(proxies.map((p) => p.close()));
    await d.stop();
  }
}

/** Runs of a scenario before one that could never be judged fails. */
const ATTEMPTS = 3;

async function run(scenario: Scenario): Promise<Outcome | string> {
  const reasons: string[] = [];
  for (let n = 0; n < ATTEMPTS; n++) {
    const outcome = await attempt(scenario);
    if (typeof outcome !== 'string') return outcome;
    reasons.push(outcome);
    process.stdout.write(`[inconclusive] ${scenario}, run ${n + 1} of ${ATTEMPTS}: ${outcome}\n`);
  }
  return `${scenario}: inconclusive ${ATTEMPTS} times: ${reasons.join('; ')}`;
}

describe('a Sentinel client in its reconnect back-off', () => {
  const outcomes = new Map<Scenario, Outcome | string>();

  beforeAll(async () => {
    Logger.overrideLogger(recorder);
    const all = await Promise.all(SCENARIOS.map((s) => run(s)));
    SCENARIOS.forEach((s, i) => outcomes.set(s, all[i]));
  }, 150_000);

  afterAll(() => Logger.overrideLogger(false));

  const outcome = (scenario: Scenario): Outcome => {
    const found = outcomes.get(scenario);
    if (found === undefined || typeof found === 'string') throw new Error(found ?? `${scenario}: not run`);
    return found;
  };

  /** The wake-up's line: why, and the back-off it cut (at least what remained of BACKOFF_MS after `minLeft` elapsed). */
  const woken = (lines: string[], why: string) => {
    const line = lines.find((l) => l.startsWith('log: ') && l.includes(`: ${why}; reconnecting now rather than in `));
    const left = Number(/rather than in (\d+) ms \(ioredis' back-off\)$/.exec(line ?? '')?.[1]);
    // The lines themselves when it is missing: what woke the client, if anything.
    return { line: line ?? lines, left };
  };

  it('a switch during a reconnect attempt that looked up the old master: the next attempt at once, not after the back-off', () => {
    const o = outcome('switch');
    expect(o.readyOn).not.toBe(o.oldPort);
    expect(o.recoveryMs).toBeLessThanOrEqual(BOUND_MS);
    const why = `Sentinel switched ${MASTER_NAME} from 127.0.0.1:${o.oldPort} to 127.0.0.1:${o.readyOn} during a reconnect attempt`;
    const { line, left } = woken(o.lines, why);
    expect(line).toEqual(expect.stringContaining('reconnecting now rather than in'));
    // It cut the back-off that followed the failed attempt, most of BACKOFF_MS.
    expect(left).toBeGreaterThan(BACKOFF_MS.switch - BOUND_MS);
    expect(o.lines.some((l) => l.includes(`now deciding on 127.0.0.1:${o.readyOn} (was 127.0.0.1:${o.oldPort})`))).toBe(true);
  });

  it('a switch the app does not hear: the lookout finds the new master named and wakes the client', () => {
    const o = outcome('unheard');
    expect(o.readyOn).not.toBe(o.oldPort);
    expect(o.recoveryMs).toBeLessThanOrEqual(BOUND_MS);
    const why = `the sentinels name 127.0.0.1:${o.readyOn} as the master of ${MASTER_NAME} (the client was on 127.0.0.1:${o.oldPort})`;
    const { line, left } = woken(o.lines, why);
    expect(line).toEqual(expect.stringContaining('reconnecting now rather than in'));
    expect(left).toBeGreaterThan(0);
    // It heard no switch: no line speaks of one.
    expect(o.lines.filter((l) => l.includes('Sentinel switched'))).toEqual([]);
  });

  it('no replica to promote, the same master comes back: Sentinel could not fail over, and the client reconnects as it answers', () => {
    const o = outcome('comeback');
    expect(o.readyOn).toBe(o.oldPort);
    expect(o.recoveryMs).toBeLessThanOrEqual(BOUND_MS);
    const abort = o.lines.find((l) => l.includes('Sentinel could not fail over'));
    expect(abort).toMatch(
      new RegExp(
        `^warn: Redis master "${MASTER_NAME}" via sentinels .*: Sentinel could not fail over: no replica of ${MASTER_NAME} can be ` +
          `promoted \\(-failover-abort-no-good-slave\\), so 127\\.0\\.0\\.1:${o.oldPort} stays the master; decisions follow failureMode ` +
          'while it does not answer, and the client reconnects as soon as it answers again$',
      ),
    );
    const { line, left } = woken(o.lines, `the master 127.0.0.1:${o.oldPort} answers again`);
    expect(line).toEqual(expect.stringContaining('reconnecting now rather than in'));
    expect(left).toBeGreaterThan(0);
  });
});
