import type { INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';
import { addressesAppModule } from './app.module.js';

/**
 * Client addresses as proxies write them into X-Forwarded-For. With trust proxy on, Express and Fastify
 * both hand the entry to the application as it is written (req.ip below is echoed by the route): a port,
 * brackets, any spelling of an IPv4-mapped address. The limiter must still find one client in it.
 */
describe.each(PLATFORMS)('client addresses behind a proxy on %s', (platform) => {
  const prefix = testPrefix(`addresses-${platform}`);
  const scope = 'AddressesController.limited';
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    const url = await redisUrl();
    client = new Redis(url);
    app = await createApp(addressesAppModule(url, prefix), platform, undefined, { trustProxy: true });
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    client?.disconnect();
  });

  /** Status and the req.ip the route saw, per forwarded address, in order. */
  async function send(...forwarded: string[]): Promise<[number, string | undefined][]> {
    const seen: [number, string | undefined][] = [];
    for (const address of forwarded) {
      const response = await request(app.getHttpServer()).get('/addresses/limited').set('X-Forwarded-For', address);
      seen.push([response.status, response.status === 200 ? response.body.ip : undefined]);
    }
    return seen;
  }

  const keysOf = async (identity: string) => (await keysUnder(client, prefix)).filter((key) => key.includes(`{${identity}}`));

  it('keeps a client that changes its source port in one bucket (a.b.c.d:port)', async () => {
    expect(await send('203.0.113.7:40001', '203.0.113.7:40002', '203.0.113.7:40003')).toEqual([
      [200, '203.0.113.7:40001'],
      [200, '203.0.113.7:40002'],
      [429, undefined],
    ]);
    expect(await keysOf('ip:203.0.113.7')).toEqual([`${prefix}{ip:203.0.113.7}:${scope}`]);
  });

  it('keeps a bracketed IPv6 client with or without a port in its /64 bucket ([v6]:port)', async () => {
    expect(await send('[2001:db8:7::1]:443', '[2001:db8:7::1]:444', '[2001:db8:7::2]')).toEqual([
      [200, '[2001:db8:7::1]:443'],
      [200, '[2001:db8:7::1]:444'],
      [429, undefined],
    ]);
    expect(await keysOf('ip:2001:db8:7:0::')).toEqual([`${prefix}{ip:2001:db8:7:0::}:${scope}`]);
  });

  it('counts every spelling of an IPv4-mapped address against the IPv4 client, and no other', async () => {
    expect(await send('::ffff:c000:201', '0:0:0:0:0:ffff:192.0.2.1', '::FFFF:C000:0201', '[::ffff:192.0.2.1]:8080')).toEqual([
      [200, '::ffff:c000:201'],
      [200, '0:0:0:0:0:ffff:192.0.2.1'],
      [429, undefined],
      [429, undefined],
    ]);
    // Another client in the same notation has its own bucket (it used to share ip:0:0:0:0:: with every such client).
    expect(await send('::ffff:c000:202', '0:0:0:0:0:ffff:192.0.2.2')).toEqual([
      [200, '::ffff:c000:202'],
      [200, '0:0:0:0:0:ffff:192.0.2.2'],
    ]);
    expect(await keysOf('ip:192.0.2.1')).toEqual([`${prefix}{ip:192.0.2.1}:${scope}`]);
    expect(await keysOf('ip:192.0.2.2')).toEqual([`${prefix}{ip:192.0.2.2}:${scope}`]);
    expect(await keysOf('ip:0:0:0:0::')).toEqual([]);
  });
});
