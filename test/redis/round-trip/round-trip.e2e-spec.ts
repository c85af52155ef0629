import { randomUUID } from 'node:crypto';
import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import type { RateLimitModuleOptions } from 'nest-redis-rate-limit';
import request from 'supertest';
import { createApp, PLATFORMS } from '../../support/app.js';
import { commandCalls, keysUnder, RedisServer, testPrefix, tokensOf } from '../../support/redis.js';
import { LUA_SCRIPTS } from '../../../libs/rate-limit/src/stores/redis/lua/lua-scripts.js';
import { roundTripAppModule } from './app.module.js';

/**
 * The commands clients send, seen through MONITOR. A script's own calls (TIME, HMGET, HSET, PEXPIRE)
 * show with the source `lua` and are left out: they run inside the one round trip.
 */
class CommandLog {
  private readonly seen: { args: string[]; source: string }[] = [];

  private constructor(
    private readonly connection: Redis,
    private readonly monitor: Redis,
    private readonly client: Redis,
    private readonly clientAddress: string,
  ) {}

  /** Watches the server at `url`; `client` is the test's own connection, whose commands are left out. */
  static async start(url: string, client: Redis): Promise<CommandLog> {
    // monitor() opens a connection of its own in monitor mode; the one it came from is closed too.
    const connection = new Redis(url);
    const monitor = await connection.monitor();
    const address = /addr=(\S+)/.exec(String(await client.client('INFO')))![1];
    const log = new CommandLog(connection, monitor, client, address);
    monitor.on('monitor', (_time: string, args: unknown[], source: string) => log.seen.push({ args: args.map(String), source }));
    return log;
  }

  /** Sends a marker and waits until MONITOR reports it: everything the server ran before is in the log. */
  private async mark(): Promise<number> {
    const marker = `mark-${randomUUID()}`;
    await this.client.echo(marker);
    const deadline = Date.now() + 5_000;
    while (Date.now() < deadline) {
      const at = this.seen.findIndex((c) => c.args[0] === 'echo' && c.args[1] === marker);
      if (at >= 0) return at;
      await new Promise((r) => setTimeout(r, 5));
    }
    throw new Error(`MONITOR did not report the marker within 5 s; saw ${JSON.stringify(this.seen.slice(-5))}`);
  }

  /**
   * Names of the commands other clients sent while `action` ran, in order; with `scripts`, an EVALSHA as
   * `evalsha:<the .lua file it runs>`.
   */
  async during(action: () => Promise<unknown>, scripts = false): Promise<string[]> {
    const from = await this.mark();
    await action();
    const to = await this.mark();
    return this.seen
      .slice(from + 1, to)
      .filter((c) => c.source !== 'lua' && c.source !== this.clientAddress)
      .map((c) => {
        const name = c.args[0].toLowerCase();
        if (!scripts || name !== 'evalsha') return name;
        return `evalsha:${LUA_SCRIPTS.find((script) => script.sha === c.args[1])?.name ?? c.args[1]}`;
      });
  }

  close(): void {
    this.monitor.disconnect();
    this.connection.disconnect();
  }
}

const N = 40;

/**
 * Exact, and with the module's `lease: true` (issue 35: a cold key costs what it costs without leases,
 * one script call per decision, with the same assertions).
 */
const MODES = [
  ['exact', {}],
  ['leased', { lease: true }],
] as const satisfies readonly (readonly [string, RateLimitModuleOptions])[];
const VARIANTS = MODES.flatMap(([mode, options]) => PLATFORMS.map((platform) => [platform, mode, options] as const));

describe.each(VARIANTS)('one round trip per decision on %s (%s)', (platform, mode, modeOptions) => {
  const prefix = testPrefix(`round-trip-${platform}-${mode}`);
  let server: RedisServer;
  let client: Redis;
  let log: CommandLog;
  let app: INestApplication;
  let url: string;
  /** What the app sent while it started (the start-up check runs the script once). */
  let startup: { sent: string[]; evalsha: number; eval: number };

  /** `n` simultaneous GETs; resolves to their statuses. */
  async function hit(path: string, n: number, headers: Record<string, string> = {}): Promise<number[]> {
    const responses = await Promise.all(Array.from({ length: n }, () => request(url).get(path).set(headers)));
    return responses.map((r) => r.status);
  }

  /** Runs `action`; returns what the app sent and how many EVALSHA / EVAL the server counted meanwhile. */
  async function measure(action: () => Promise<unknown>) {
    const [evalsha, evalBody] = [await commandCalls(client, 'evalsha'), await commandCalls(client, 'eval')];
    const sent = await log.during(action);
    return {
      sent,
      evalsha: (await commandCalls(client, 'evalsha')) - evalsha,
      eval: (await commandCalls(client, 'eval')) - evalBody,
    };
  }

  beforeAll(async () => {
    // A server of the test's own: the shared one counts every other test's commands too.
    server = await RedisServer.start();
    client = new Redis(server.url);
    log = await CommandLog.start(server.url, client);
    startup = await measure(async () => {
      app = await createApp(roundTripAppModule({ redis: server.url, keyPrefix: prefix, ...modeOptions }), platform);
    });
    await app.listen(0, '127.0.0.1');
    url = await app.getUrl();
  });

  afterAll(async () => {
    await app?.close();
    log?.close();
    client?.disconnect();
    await server?.stop();
  });

  it('sends the script body once, with the start-up check, and the first decision is one EVALSHA', async () => {
    expect({ eval: startup.eval, bodies: startup.sent.filter((command) => command === 'eval').length }).toEqual({ eval: 1, bodies: 1 });
    const first = await measure(() => hit('/rt/single', 1));
    expect(first).toEqual({ sent: ['evalsha'], evalsha: 1, eval: 0 });
  });

  it(`answers ${N} allowed requests on a one-policy route with exactly ${N} EVALSHA and no other command`, async () => {
    let statuses: number[] = [];
    const counted = await measure(async () => (statuses = await hit('/rt/single', N)));
    expect(statuses).toEqual(new Array(N).fill(200));
    expect(counted).toEqual({ sent: new Array(N).fill('evalsha'), evalsha: N, eval: 0 });
  });

  it(`answers ${N} allowed requests on a two-policy route with exactly ${N} EVALSHA, each draining both buckets`, async () => {
    let statuses: number[] = [];
    const counted = await measure(async () => (statuses = await hit('/rt/double', N)));
    expect(statuses).toEqual(new Array(N).fill(200));
    expect(counted).toEqual({ sent: new Array(N).fill('evalsha'), evalsha: N, eval: 0 });
    for (const scope of ['rt-burst', 'rt-hourly']) {
      const tokens = await tokensOf(client, `${prefix}{ip:127.0.0.1}:${scope}`);
      expect(tokens).toBeGreaterThanOrEqual(1000 - N);
      expect(tokens).toBeLessThan(1000 - N + 1);
    }
  });

  it('decides policies on different identities (IP and API key) in the same single EVALSHA', async () => {
    let statuses: number[] = [];
    const counted = await measure(async () => (statuses = await hit('/rt/mixed', N, { 'x-api-key': 'round-trip-key' })));
    expect(statuses).toEqual(new Array(N).fill(200));
    expect(counted).toEqual({ sent: new Array(N).fill('evalsha'), evalsha: N, eval: 0 });
    const keys = await keysUnder(client, prefix);
    expect(keys.filter((k) => k.endsWith(':rt-ip') || k.endsWith(':rt-key'))).toHaveLength(2);
  });

  it('spends at most one EVALSHA on a denied request, and no command on a route without a policy', async () => {
    const statuses: number[] = [];
    const limited = await measure(async () => {
      for (let i = 0; i < 12; i++) statuses.push((await request(url).get('/rt/tight')).status);
    });
    expect(statuses).toEqual([...new Array(5).fill(200), ...new Array(7).fill(429)]);
    // 5 allowed and the first denial reach Redis; later denials may be answered without it.
    expect(limited.evalsha).toBeGreaterThanOrEqual(6);
    expect(limited.evalsha).toBeLessThanOrEqual(12);
    expect(limited).toEqual({ sent: new Array(limited.evalsha).fill('evalsha'), evalsha: limited.evalsha, eval: 0 });
    const free = await measure(() => hit('/rt/free', 10));
    expect(free).toEqual({ sent: [], evalsha: 0, eval: 0 });
  });

  it('decides a rate policy and a concurrency slot of the same phase in one EVALSHA (without leases), and gives the slot back in one more', async () => {
    const statuses: number[] = [];
    const requests = async (n: number) => {
      for (let i = 0; i < n; i++) statuses.push(...(await hit('/rt/slot', 1)));
      // The last slot goes back after its response: wait until no slot is held.
      for (let i = 0; i < 200 && (await keysUnder(client, prefix)).some((key) => key.includes('}!')); i++) {
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    };
    // The first call of each script sends its body (EVAL, after a refused EVALSHA): counted above.
    await requests(1);
    const sent = await log.during(() => requests(10), true);
    expect(statuses).toEqual(new Array(11).fill(200));
    const tally = (names: string[]) =>
      Object.fromEntries([...new Set(names)].sort().map((name) => [name, names.filter((n) => n === name).length]));
    // With leases on, a leased policy may answer without Redis, so its slot is a call of its own.
    expect(tally(sent)).toEqual(
      mode === 'exact'
        ? { 'evalsha:slot-give-back': 10, 'evalsha:take-with-slot': 10 }
        : { 'evalsha:decide': 10, 'evalsha:slot-give-back': 10, 'evalsha:slot-take': 10 },
    );
    expect(await tokensOf(client, `${prefix}{ip:127.0.0.1}:rt-slot-rate`)).toBeLessThan(1000 - 11 + 1);
  });

  it('reloads the script once after SCRIPT FLUSH (one refused EVALSHA, one EVAL), then EVALSHA only', async () => {
    await client.script('FLUSH');
    let statuses: number[] = [];
    const reload = await measure(async () => (statuses = await hit('/rt/single', 1)));
    expect(statuses).toEqual([200]);
    expect(reload.sent).toEqual(['evalsha', 'eval']);
    expect(reload.eval).toBe(1);
    const after = await measure(() => hit('/rt/single', 10));
    expect(after).toEqual({ sent: new Array(10).fill('evalsha'), evalsha: 10, eval: 0 });
  });
});
