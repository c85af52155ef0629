import { Redis } from 'ioredis';
import { ownedConnectionOf } from '../../../libs/rate-limit/src/stores/redis/owned-connection.js';
import { createRedisClient } from '../../../libs/rate-limit/src/stores/redis/redis-client.js';
import { isSentinel, SENTINEL_DEFAULTS, withSentinelDefaults } from '../../../libs/rate-limit/src/stores/redis/sentinel-watch.js';

const sentinels = [{ host: '127.0.0.1', port: 26379 }];

describe('the defaults of a Sentinel client the module creates', () => {
  it('are added to { sentinels, name } where the options do not set them', () => {
    expect(withSentinelDefaults({ sentinels, name: 'main' })).toEqual({ sentinels, name: 'main', ...SENTINEL_DEFAULTS });
    expect(SENTINEL_DEFAULTS).toEqual({ sentinelCommandTimeout: 1000 });
  });

  it("keep the application's own values", () => {
    const own = { sentinels, name: 'main', socketTimeout: 5000, sentinelCommandTimeout: 200 };
    expect(withSentinelDefaults(own)).toEqual(own);
    // A socketTimeout of the application's own replaces the module's liveness check.
    const { client } = createRedisClient(own);
    expect(ownedConnectionOf(client)?.liveness).toBeUndefined();
    client.disconnect();
  });

  it('leave other options alone: a single server, or sentinels without a master name', () => {
    const single = { host: 'cache', port: 6380 };
    expect(withSentinelDefaults(single)).toBe(single);
    expect(isSentinel({ sentinels: [], name: 'main' })).toBe(false);
    expect(isSentinel({ sentinels })).toBe(false);
  });

  it('reach the client createRedisClient builds (lazily: nothing connects here)', () => {
    const { client, owned } = createRedisClient({ sentinels, name: 'main' });
    expect(owned).toBe(true);
    expect(client).toBeInstanceOf(Redis);
    expect((client as Redis).options).toMatchObject({ sentinelCommandTimeout: 1000, failoverDetector: false });
    // Not socketTimeout: a stall of the app would drop a healthy connection; `Liveness` leaves a frozen master.
    expect((client as Redis).options.socketTimeout).toBeUndefined();
    expect(ownedConnectionOf(client)?.liveness).toBeDefined();
    expect((client as Redis).status).toBe('wait');
    client.disconnect();
  });
});
