import { type INestApplication, Module, type Type } from '@nestjs/common';
import { RateLimitModule, type RateLimitModuleOptions } from 'nest-redis-rate-limit';
import { createApp } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { OpenController, RawKeyController } from './raw-api-key.controllers.js';

/**
 * Without `keys.apiKey`, `keyBy: 'apiKey'` trusts the header as sent: a client that invents a key per
 * request gets a bucket per request. Start-up says so once, naming the routes that nothing else bounds.
 */
describe('a keyBy apiKey policy without keys.apiKey', () => {
  const apps: INestApplication[] = [];

  async function start(options: RateLimitModuleOptions, controllers: Type[] = [RawKeyController]): Promise<string[]> {
    const recorder = new LogRecorder();
    @Module({ imports: [RateLimitModule.forRoot({ store: 'memory', ...options })], controllers })
    class RawApiKeyAppModule {}
    apps.push(await createApp(RawApiKeyAppModule, 'express', (app) => app.useLogger(recorder)));
    return recorder.of('RateLimit', 'warn');
  }

  afterAll(async () => {
    for (const app of apps) await app.close();
  });

  it('warns once at start-up that the raw header is trusted, naming the routes limited by the key alone', async () => {
    const warnings = await start({});
    expect(warnings).toEqual([
      "keyBy 'apiKey' on RawKeyController.onlyKey, RawKeyController.reports, RawKeyController.shadowIp trusts the x-api-key " +
        'header as sent (keys.apiKey is not set): a client that invents a new key for each request gets a new bucket each ' +
        'time, so these routes are not limited. Set keys: { apiKey: (req) => ... } to look the key up and return undefined ' +
        "for an unknown one (it then counts as its sender's IP), or stack a per-IP @RateLimit beside it",
    ]);
  });

  it('names the header the module reads (keys.apiKeyHeader)', async () => {
    const [warning] = await start({ keys: { apiKeyHeader: 'x-client-key' } });
    expect(warning).toContain('trusts the x-client-key header as sent');
  });

  it('names the routes that module defaults keyed by apiKey reach', async () => {
    const warnings = await start({ defaults: { capacity: 5, refillPerSecond: 1, keyBy: 'apiKey' } }, [OpenController]);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^keyBy 'apiKey' on OpenController\.open trusts the x-api-key header as sent/);
  });

  it('says nothing when keys.apiKey verifies the keys', async () => {
    expect(await start({ keys: { apiKey: () => undefined } })).toEqual([]);
  });

  it('says nothing about routes limited by IP only, or not limited', async () => {
    expect(await start({}, [OpenController])).toEqual([]);
  });
});
