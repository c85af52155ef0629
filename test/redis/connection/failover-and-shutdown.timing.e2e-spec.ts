import { createServer, type Server, type Socket, connect } from 'node:net';
import type { LoggerService } from '@nestjs/common';
import { Test, type TestingModule } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { BucketService, RateLimitModule, RateLimitUnavailableError } from 'nest-redis-rate-limit';
import { sleep } from '../../support/load.js';
import { watchLoopDelay } from '../../support/loop-delay.js';
import { RedisServer, tokensOf } from '../../support/redis.js';

class LogRecorder implements LoggerService {
  readonly warnings: string[] = [];
  log() {}
  error() {}
  warn(message: unknown, context?: string) {
    if (context === 'RateLimit') this.warnings.push(String(message));
  }
}

/**
 * A TCP proxy whose target can change: what a DNS name or a cloud endpoint does when a failover promotes
 * another server. Connections already open keep their old target; new ones reach the new one.
 */
class SwitchingProxy {
  private readonly sockets = new Set<Socket>();
  private server?: Server;
  port = 0;

  constructor(public targetPort: number) {}

  async start(): Promise<void> {
    this.server = createServer((inbound) => {
      const outbound = connect(this.targetPort, '127.0.0.1');
      for (const socket of [inbound, outbound]) {
        this.sockets.add(socket);
        socket.on('error', () => undefined);
        socket.on('close', () => {
          this.sockets.delete(socket);
          inbound.destroy();
          outbound.destroy();
        });
      }
      inbound.pipe(outbound);
      outbound.pipe(inbound);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
  }

  async stop(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise<void>((resolve) => this.server?.close(() => resolve()) ?? resolve());
  }
}

const policy = { capacity: 10, refillPerSecond: 0.001 };

describe('a demoted master (READONLY)', () => {
  let oldMaster: RedisServer;
  let newMaster: RedisServer;
  let proxy: SwitchingProxy;
  let moduleRef: TestingModule;
  const recorder = new LogRecorder();

  beforeAll(async () => {
    [oldMaster, newMaster] = await Promise.all([RedisServer.start(), RedisServer.start()]);
    proxy = new SwitchingProxy(oldMaster.port);
    await proxy.start();
    moduleRef = await Test.createTestingModule({
      imports: [RateLimitModule.forRoot({ redis: `redis://127.0.0.1:${proxy.port}`, failureMode: 'closed', timeoutMs: 500 })],
    })
      .setLogger(recorder)
      .compile();
    await moduleRef.init();
  });

  afterAll(async () => {
    await moduleRef?.close();
    await proxy?.stop();
    await Promise.all([oldMaster?.stop(), newMaster?.stop()]);
  });

  it('makes the module reconnect, to the new master, without replaying the refused decision', async () => {
    const buckets = moduleRef.get(BucketService);
    expect((await buckets.consume('failover', policy)).remaining).toBe(9);

    // Failover: the old master becomes a replica of the new one, and the address now leads to the new one.
    const admin = new Redis(oldMaster.url);
    await admin.call('REPLICAOF', '127.0.0.1', String(newMaster.port));
    admin.disconnect();
    proxy.targetPort = newMaster.port;

    // The decision that meets the read-only replica fails (closed mode) ...
    await expect(buckets.consume('failover', policy)).rejects.toBeInstanceOf(RateLimitUnavailableError);
    // ... and the client reconnects instead of staying on the replica until the socket drops.
    let remaining: number | undefined;
    const deadline = Date.now() + 3000;
    while (remaining === undefined && Date.now() < deadline) {
      try {
        remaining = (await buckets.consume('failover', policy)).remaining;
      } catch {
        await sleep(20);
      }
    }
    // A fresh bucket on the new master: the refused decision was not sent again after the reconnect.
    expect(remaining).toBe(9);
    const check = new Redis(newMaster.url);
    expect(await tokensOf(check, 'rl:{failover}')).toBeCloseTo(9, 3);
    check.disconnect();
    expect(recorder.warnings.some((w) => w.includes(`Redis at 127.0.0.1:${proxy.port} answered READONLY`))).toBe(true);
    expect(recorder.warnings.find((w) => w.includes('READONLY'))).toContain('reconnecting; the refused command is not sent again');
  });
});

describe('shutdown', () => {
  /** Starts the module on `server` and lets one decision through, so the connection is in use. */
  async function started(server: RedisServer): Promise<TestingModule> {
    const moduleRef = await Test.createTestingModule({ imports: [RateLimitModule.forRoot({ redis: server.url })] })
      .setLogger({ log() {}, warn() {}, error() {} })
      .compile();
    await moduleRef.init();
    expect((await moduleRef.get(BucketService).consume('shutdown', policy)).allowed).toBe(true);
    return moduleRef;
  }

  /**
   * How long `close()` takes (`ms`), and that less the event-loop delay over it (`waitedMs`: what it
   * waited, however busy the machine); Infinity when it has not returned after `limitMs`.
   */
  async function closeTime(moduleRef: TestingModule, limitMs = 5000): Promise<{ ms: number; waitedMs: number }> {
    const loop = watchLoopDelay();
    const start = performance.now();
    const closed = moduleRef.close().then(() => performance.now());
    const ended = await Promise.race([closed, sleep(limitMs).then(() => Infinity)]);
    loop.stop();
    const ms = ended - start;
    return { ms, waitedMs: ms === Infinity ? ms : ms - loop.over(start, ended) };
  }

  it('is bounded while Redis hangs: app.close() returns within about 600 ms on a paused server', async () => {
    const server = await RedisServer.start();
    try {
      const moduleRef = await started(server);
      server.signal('SIGSTOP');
      const { ms, waitedMs } = await closeTime(moduleRef);
      if (process.env.RL_TEST_FIGURES) process.stdout.write(`[figure] app.close() with Redis paused (ms): ${ms.toFixed(0)}\n`);
      expect(waitedMs).toBeLessThan(1000);
      expect(ms).toBeGreaterThanOrEqual(450); // QUIT had its chance first
    } finally {
      server.signal('SIGCONT');
      await server.stop();
    }
  });

  it('closes at once with QUIT when Redis answers', async () => {
    const server = await RedisServer.start();
    try {
      const admin = new Redis(server.url);
      const moduleRef = await started(server);
      expect((await closeTime(moduleRef)).waitedMs).toBeLessThan(200);
      const clients = await admin.client('LIST');
      admin.disconnect();
      expect(String(clients).split('\n').filter(Boolean)).toHaveLength(1); // only the admin connection is left
    } finally {
      await server.stop();
    }
  });
});
