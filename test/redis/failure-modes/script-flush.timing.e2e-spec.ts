import { DECIDE_SCRIPT } from '../../../libs/rate-limit/src/stores/redis/lua/lua-scripts.js';
import { PLATFORMS } from '../../support/app.js';
import { countByStatus, sleep, startLoad } from '../../support/load.js';
import { commandCalls, testPrefix } from '../../support/redis.js';
import { BULK_CAPACITY } from './failure.controller.js';
import { appOnOwnRedis } from './fixture.js';
import { burst } from './scenario.js';

/**
 * SCRIPT FLUSH (or a Redis that lost its script cache some other way) must cost nothing but one
 * reload. failureMode 'closed' makes any decision that failed visible as a 503; the timeout is long,
 * because this file is about reloads, and a reload on a machine busy with other tests may take longer
 * than the default 100 ms.
 */
const RELOAD_TIMEOUT_MS = 2_000;
const SHA = DECIDE_SCRIPT.sha;

describe.each(PLATFORMS)('SCRIPT FLUSH while the app runs on %s', (platform) => {
  const prefix = testPrefix(`script-flush-${platform}`);
  // Its own server: flushing the script cache of the shared one would disturb other test files.
  const fx = appOnOwnRedis(platform, { keyPrefix: prefix, failureMode: 'closed', timeoutMs: RELOAD_TIMEOUT_MS }, { inspect: true });

  it('reloads the script on the next decision and keeps counting the same bucket', async () => {
    const first = await burst(fx.url, 'flushed', 4);
    expect(first.map((a) => [a.status, a.remaining])).toEqual([
      [200, '9'],
      [200, '8'],
      [200, '7'],
      [200, '6'],
    ]);
    expect(await fx.client.script('EXISTS', SHA)).toEqual([1]);
    await fx.client.script('FLUSH');
    expect(await fx.client.script('EXISTS', SHA)).toEqual([0]);

    const rest = await burst(fx.url, 'flushed', 7);
    expect(rest.map((a) => [a.status, a.remaining])).toEqual([
      [200, '5'],
      [200, '4'],
      [200, '3'],
      [200, '2'],
      [200, '1'],
      [200, '0'],
      [429, '0'],
    ]);
    expect(await fx.client.script('EXISTS', SHA)).toEqual([1]);
  });

  it('allows exactly the capacity of a bucket, and fails no decision, while 32 concurrent streams run and the script cache is flushed every 2 ms', async () => {
    const evalsBefore = await commandCalls(fx.client, 'eval');
    // Flushes this often land between ioredis's reload of the script and the commands queued behind
    // it: the store must try such a decision once more, not fail it.
    // The client waits as long as the test may: 32 streams in the same process as the app, on a loaded
    // machine, took over the default 5 s for an answer (status 0: no answer). A decision itself is bounded
    // by RELOAD_TIMEOUT_MS ('closed': a 503 past it); only an app that never answers stays status 0.
    const load = startLoad(`${fx.url}/bulk`, 32, { headers: { 'x-api-key': 'bulk' }, clientTimeoutMs: 20_000 });
    let flushes = 0;
    while (load.answers.length < BULK_CAPACITY + 150) {
      await fx.client.script('FLUSH');
      flushes++;
      await sleep(2);
    }
    load.stop();
    const answers = await load.done;
    const reloads = (await commandCalls(fx.client, 'eval')) - evalsBefore;

    expect(flushes).toBeGreaterThanOrEqual(5);
    expect(reloads).toBeGreaterThanOrEqual(5);
    // Every request answered (and if not, why), then exactly the capacity allowed and no decision failed.
    expect(answers.filter((a) => a.status === 0).map((a) => `${a.error} after ${Math.round(a.endedAt - a.startedAt)} ms`)).toEqual([]);
    expect(countByStatus(answers)).toEqual({ 200: BULK_CAPACITY, 429: answers.length - BULK_CAPACITY });
  });
});
