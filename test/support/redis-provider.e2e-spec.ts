import { findRedis, isLoopback, LOCAL_REDIS, machineProbes, type RedisProbes, type RuntimeProbe } from './redis.js';

/**
 * The order in which the tests find a Redis, with every probe stubbed: no Redis, binary or Docker
 * engine is needed (or touched) here. `calls` records which probes ran, in order.
 */

interface Machine {
  configuredUrl?: string;
  answering?: string[];
  binary?: boolean;
  runtime?: RuntimeProbe;
  containerFails?: string;
}

function stubbed(machine: Machine): { probes: RedisProbes; calls: string[] } {
  const calls: string[] = [];
  const probes: RedisProbes = {
    configuredUrl: machine.configuredUrl,
    ping: async (url) => {
      calls.push(`ping ${url}`);
      return (machine.answering ?? []).includes(url);
    },
    hasRedisServerBinary: () => {
      calls.push('binary?');
      return machine.binary ?? false;
    },
    startRedisServer: async () => {
      calls.push('start redis-server');
      return 'redis://127.0.0.1:40001';
    },
    containerRuntime: async () => {
      calls.push('container runtime?');
      return machine.runtime ?? { answers: false, reason: 'no container runtime answers: stubbed' };
    },
    startRedisContainer: async () => {
      calls.push('start container');
      if (machine.containerFails) throw new Error(machine.containerFails);
      return 'redis://localhost:32768';
    },
  };
  return { probes, calls };
}

describe('findRedis: REDIS_URL (or, on a silent loopback port, a redis-server of its own), then 127.0.0.1:6379, then a redis-server binary, then a container, then an error', () => {
  it('takes REDIS_URL when it answers, and asks nothing else', async () => {
    const { probes, calls } = stubbed({ configuredUrl: 'redis://cache:6380', answering: ['redis://cache:6380', LOCAL_REDIS] });
    expect(await findRedis(probes)).toEqual({ url: 'redis://cache:6380', source: 'REDIS_URL' });
    expect(calls).toEqual(['ping redis://cache:6380']);
  });

  it('fails on a REDIS_URL that does not answer instead of quietly using another Redis', async () => {
    const { probes, calls } = stubbed({ configuredUrl: 'redis://cache:6380', answering: [LOCAL_REDIS], binary: true });
    await expect(findRedis(probes)).rejects.toThrow('REDIS_URL=redis://cache:6380 does not answer PING');
    expect(calls).toEqual(['ping redis://cache:6380']);
  });

  it('starts a redis-server of its own when REDIS_URL names a loopback port where nothing listens', async () => {
    const { probes, calls } = stubbed({ configuredUrl: 'redis://127.0.0.1:1', answering: [LOCAL_REDIS], binary: true });
    expect(await findRedis(probes)).toEqual({ url: 'redis://127.0.0.1:40001', source: 'redis-server' });
    expect(calls).toEqual(['ping redis://127.0.0.1:1', 'binary?', 'start redis-server']);
  });

  it('fails on a loopback REDIS_URL that does not answer when there is no redis-server binary', async () => {
    const { probes, calls } = stubbed({ configuredUrl: 'redis://localhost:6390', answering: [LOCAL_REDIS] });
    await expect(findRedis(probes)).rejects.toThrow('REDIS_URL=redis://localhost:6390 does not answer PING');
    expect(calls).toEqual(['ping redis://localhost:6390', 'binary?']);
  });

  it('takes 127.0.0.1:6379 when REDIS_URL is unset and it answers', async () => {
    const { probes, calls } = stubbed({ answering: [LOCAL_REDIS], binary: true, runtime: { answers: true } });
    expect(await findRedis(probes)).toEqual({ url: LOCAL_REDIS, source: '127.0.0.1:6379' });
    expect(calls).toEqual([`ping ${LOCAL_REDIS}`]);
  });

  it('starts a redis-server binary when nothing answers on 127.0.0.1:6379', async () => {
    const { probes, calls } = stubbed({ binary: true, runtime: { answers: true } });
    expect(await findRedis(probes)).toEqual({ url: 'redis://127.0.0.1:40001', source: 'redis-server' });
    expect(calls).toEqual([`ping ${LOCAL_REDIS}`, 'binary?', 'start redis-server']);
  });

  it('starts a container when there is no binary and a container runtime answers', async () => {
    const { probes, calls } = stubbed({ runtime: { answers: true } });
    expect(await findRedis(probes)).toEqual({ url: 'redis://localhost:32768', source: 'container' });
    expect(calls).toEqual([`ping ${LOCAL_REDIS}`, 'binary?', 'container runtime?', 'start container']);
  });

  it('says why when the container does not start', async () => {
    const { probes } = stubbed({ runtime: { answers: true }, containerFails: 'pull access denied for redis' });
    await expect(findRedis(probes)).rejects.toThrow('Could not start a Redis container: pull access denied for redis');
  });

  it('ends with an error naming every way to get a Redis, and why no container runtime was usable', async () => {
    const { probes, calls } = stubbed({
      runtime: { answers: false, reason: 'no container runtime answers: Could not find a working container runtime strategy' },
    });
    const failure = findRedis(probes);
    await expect(failure).rejects.toThrow(/^No Redis for the tests: set REDIS_URL, run redis-server on 127\.0\.0\.1:6379/);
    await expect(failure).rejects.toThrow('install redis-server');
    await expect(failure).rejects.toThrow(
      'or run a Docker engine for testcontainers (no container runtime answers: Could not find a working container runtime strategy)',
    );
    expect(calls).toEqual([`ping ${LOCAL_REDIS}`, 'binary?', 'container runtime?']);
  });

  it("reads REDIS_URL from the environment when the machine's probes are made", () => {
    const saved = process.env.REDIS_URL;
    try {
      process.env.REDIS_URL = 'redis://elsewhere:6379';
      expect(machineProbes().configuredUrl).toBe('redis://elsewhere:6379');
      delete process.env.REDIS_URL;
      expect(machineProbes().configuredUrl).toBeUndefined();
    } finally {
      if (saved === undefined) delete process.env.REDIS_URL;
      else process.env.REDIS_URL = saved;
    }
  });

  it("probes this machine's container runtime without throwing, with a reason when it cannot be used", async () => {
    const runtime = await machineProbes().containerRuntime();
    if (!runtime.answers) expect(runtime.reason).toMatch(/^(testcontainers cannot be loaded on Node|no container runtime answers: )/);
  }, 60_000);
});

describe('isLoopback', () => {
  it('knows the addresses of this machine from the others', () => {
    for (const url of [
      'redis://127.0.0.1:1',
      'redis://127.1.2.3:6379',
      'redis://localhost:6380',
      'redis://[::1]:6379',
      'redis://:pw@127.0.0.1:6379/2',
    ]) {
      expect([url, isLoopback(url)]).toEqual([url, true]);
    }
    for (const url of ['redis://cache:6380', 'redis://10.0.0.5:6379', 'redis://128.0.0.1:6379', 'not a url']) {
      expect([url, isLoopback(url)]).toEqual([url, false]);
    }
  });
});
