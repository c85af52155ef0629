import { createServer, type Server } from 'node:net';
import { freePort, neverTwice, pingRedis, RedisServer, START_TRIES } from './redis.js';
import { LocalSentinels } from './sentinel.js';

/**
 * The tests' own servers start on ports `freePort` found free, and another process may take such a port
 * before the server binds it (an outgoing connection takes its local port from the same range): seen
 * once, when a Sentinel deployment of four started at once waited 20 s for a process that had exited at
 * once, and failed its file. Here a port is held by a listener of this file and handed to the start as
 * if it had been taken meanwhile.
 */
describe('servers of the tests own, on a port taken meanwhile', () => {
  let holder: Server;
  let taken: number;

  beforeAll(async () => {
    // It closes what it accepts at once, as a server that is not Redis would, sooner or later.
    holder = createServer((socket) => socket.destroy());
    await new Promise<void>((resolve) => holder.listen(0, '127.0.0.1', resolve));
    taken = (holder.address() as { port: number }).port;
  });

  afterAll(() => new Promise<void>((resolve) => holder.close(() => resolve())));

  /** A port source like `freePort` whose `at`-th port (from 0) is the taken one, and every `every`-th after it. */
  function takenAt(at: number, every = Infinity): () => Promise<number> {
    let n = 0;
    return () => {
      const i = n++;
      return i === at || (i > at && (i - at) % every === 0) ? Promise.resolve(taken) : freePort();
    };
  }

  it('freePort never hands out a port twice, even when the system gives one again', async () => {
    const given = [40001, 40001, 40002, 40001, 40003];
    const ports = neverTwice(async () => given.shift()!);
    expect([await ports(), await ports(), await ports()]).toEqual([40001, 40002, 40003]);
    const free = [];
    for (let i = 0; i < 100; i++) free.push(await freePort());
    expect(new Set(free).size).toBe(100);
    expect(free).not.toContain(taken);
  });

  it('RedisServer.start starts again on another port', async () => {
    const server = await RedisServer.start([], undefined, takenAt(0));
    try {
      expect(server.port).not.toBe(taken);
      expect(await pingRedis(server.url, 1000)).toBe(true);
    } finally {
      await server.stop();
    }
  });

  it.each([
    ['the master', 0],
    ["a sentinel's", 3],
  ])('LocalSentinels.start starts the deployment again on other ports when %s port was taken', async (_role, at) => {
    const deployment = await LocalSentinels.start({ failover: false, port: takenAt(at) });
    try {
      const ports = [...deployment.servers, ...deployment.sentinels].map((n) => n.port);
      expect(ports).not.toContain(taken);
      expect(await Promise.all(ports.map((port) => pingRedis(`redis://127.0.0.1:${port}`, 1000)))).toEqual([true, true, true, true, true]);
    } finally {
      await deployment.stop();
    }
  });

  it(`says why after ${START_TRIES} starts that all exited`, async () => {
    // Each start takes five ports: the first of each is the taken one.
    await expect(LocalSentinels.start({ failover: false, port: takenAt(0, 5) })).rejects.toThrow(
      new RegExp(`${START_TRIES} starts failed: the master on port ${taken} exited with 1 at start-up \\(it logged: .*${taken}.*\\)`),
    );
    await expect(RedisServer.start([], undefined, () => Promise.resolve(taken))).rejects.toThrow(
      new RegExp(`${START_TRIES} starts failed: redis-server \\(pid \\d+\\) on port ${taken} exited with 1 before it answered`),
    );
  });
});
