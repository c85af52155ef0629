import { createHash } from 'node:crypto';
import {
  type CanActivate,
  Controller,
  type ExecutionContext,
  Get,
  type INestApplication,
  Injectable,
  Module,
  Req,
  UseGuards,
} from '@nestjs/common';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimit, RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';

/**
 * The identities the module reads when the app configures nothing but `keys.apiKeyHeader`: the API key
 * from that header (and only from it), and the user from `req.user.id` as an auth guard of the app
 * sets it, string or number. Expected keys are written from the README's format
 * (`{keyPrefix}{<identity>}:<scope>`, `key:<32 hex digits of SHA-256>` without `keys.secret`).
 */
const SLOW = 0.001;

/** Stands in for an auth guard: `x-user` becomes `req.user`, digits as a number (as a database id would be). */
@Injectable()
class HeaderUserGuard implements CanActivate {
  canActivate(context: ExecutionContext): boolean {
    const req = context.switchToHttp().getRequest();
    const raw = req.headers['x-user'];
    if (typeof raw === 'string') req.user = { id: /^\d+$/.test(raw) ? Number(raw) : raw };
    return true;
  }
}

@Controller('who')
class WhoController {
  @Get('token')
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, keyBy: 'apiKey', name: 'by-token' })
  token() {
    return { ok: true };
  }

  @Get('user')
  @UseGuards(HeaderUserGuard)
  @RateLimit({ capacity: 2, refillPerSecond: SLOW, keyBy: 'user', name: 'by-user' })
  user(@Req() req: { user?: unknown }) {
    return { user: req.user };
  }
}

const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);

describe.each(PLATFORMS)('identities from keys.apiKeyHeader and req.user.id on %s', (platform) => {
  const prefix = testPrefix(`default-identities-${platform}`);
  let client: Redis;
  let app: INestApplication;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({
      imports: [RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix, keys: { apiKeyHeader: 'X-Client-Token' } })],
      controllers: [WhoController],
    })
    class WhoAppModule {}
    app = await createApp(WhoAppModule, platform);
  });

  afterAll(async () => {
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  const get = (path: string, headers: Record<string, string> = {}) => request(app.getHttpServer()).get(path).set(headers);

  it('reads the API key from the configured header (named in any case), one bucket per key', async () => {
    const remaining = [];
    for (let i = 0; i < 2; i++)
      remaining.push((await get('/who/token', { 'x-client-token': 'alpha' }).expect(200)).headers['x-ratelimit-remaining']);
    expect(remaining).toEqual(['1', '0']);
    expect((await get('/who/token', { 'x-client-token': 'alpha' }).expect(429)).headers['retry-after']).toBe('1000');
    // Another key is another bucket.
    expect((await get('/who/token', { 'x-client-token': 'beta' }).expect(200)).headers['x-ratelimit-remaining']).toBe('1');
    expect(await keysUnder(client, `${prefix}{key:`)).toEqual(
      [`${prefix}{key:${sha('alpha')}}:by-token`, `${prefix}{key:${sha('beta')}}:by-token`].sort(),
    );
  });

  it('does not read x-api-key when another header is configured: such a request counts as its IP', async () => {
    await get('/who/token', { 'x-api-key': 'gamma' }).expect(200);
    expect(await keysUnder(client, `${prefix}{ip:`)).toEqual([`${prefix}{ip:127.0.0.1}:by-token`]);
    expect(await keysUnder(client, `${prefix}{key:${sha('gamma')}}`)).toEqual([]);
  });

  it('limits by req.user.id as the app’s guard set it, numeric ids included (0 too)', async () => {
    for (const id of ['ann', '42', '0']) {
      const first = await get('/who/user', { 'x-user': id }).expect(200);
      expect(first.body).toEqual({ user: { id: /^\d+$/.test(id) ? Number(id) : id } });
      expect(first.headers['x-ratelimit-remaining']).toBe('1');
      await get('/who/user', { 'x-user': id }).expect(200);
      await get('/who/user', { 'x-user': id }).expect(429);
    }
    expect(await keysUnder(client, `${prefix}{user:`)).toEqual(
      [`${prefix}{user:0}:by-user`, `${prefix}{user:42}:by-user`, `${prefix}{user:ann}:by-user`].sort(),
    );
    // No user at all: the IP bucket of that policy.
    await get('/who/user').expect(200);
    expect(await keysUnder(client, `${prefix}{ip:127.0.0.1}:by-user`)).toEqual([`${prefix}{ip:127.0.0.1}:by-user`]);
  });
});
