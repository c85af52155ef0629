import { type INestApplication, Logger, Module } from '@nestjs/common';
import { JwtService } from '@nestjs/jwt';
import { Redis } from 'ioredis';
import request from 'supertest';
import { RateLimitModule } from 'nest-redis-rate-limit';
import { createApp, PLATFORMS } from '../../support/app.js';
import { LogRecorder } from '../../support/log-recorder.js';
import { deleteKeys, keysUnder, redisUrl, testPrefix } from '../../support/redis.js';
import { DOCS_USERS, DocsAuthModule, DocsController, ShapesController, UnguardedController } from './user-shapes.controllers.js';

/**
 * keyBy 'user' without `keys.user` finds the user where apps put it: `req.user.id`, else `userId` (the
 * NestJS docs' passport-jwt strategy), else `sub` (a raw JWT payload, as the docs' own auth guard leaves
 * it), a string or a finite number. When it finds none it says what it looked for and why it found nothing.
 */
describe.each(PLATFORMS)('the default user identity on %s', (platform) => {
  const prefix = testPrefix(`user-shapes-${platform}`);
  const recorder = new LogRecorder();
  let client: Redis;
  let app: INestApplication;
  let tokens: Record<'alice' | 'bob', string>;

  beforeAll(async () => {
    client = new Redis(await redisUrl());
    @Module({
      imports: [DocsAuthModule, RateLimitModule.forRoot({ redis: await redisUrl(), keyPrefix: prefix })],
      controllers: [DocsController, ShapesController, UnguardedController],
    })
    class UserShapesAppModule {}
    app = await createApp(UserShapesAppModule, platform);
    Logger.overrideLogger(recorder);
    const jwt = app.get(JwtService);
    // What the docs' AuthService.signIn signs.
    const sign = ({ userId, username }: { userId: number; username: string }) => jwt.sign({ sub: userId, username });
    tokens = { alice: sign(DOCS_USERS.alice), bob: sign(DOCS_USERS.bob) };
  });

  afterAll(async () => {
    Logger.overrideLogger(false);
    await app?.close();
    await deleteKeys(client, prefix);
    await client.quit();
  });

  const get = (path: string, headers: Record<string, string> = {}) => request(app.getHttpServer()).get(path).set(headers);
  const asUser = (path: string, user: 'alice' | 'bob') => get(path, { authorization: `Bearer ${tokens[user]}` });
  const warnings = () => recorder.of('RateLimit', 'warn');

  it.each([
    ['the docs’ passport-jwt strategy ({ userId, username })', '/docs/passport', 'DocsController.passport'],
    ['the docs’ guard putting the verified JWT payload ({ sub, username }) on request.user', '/docs/payload', 'DocsController.payload'],
  ])('gives Alice and Bob a bucket each behind %s, by their numeric ids', async (_, path, scope) => {
    recorder.clear();
    const remaining: string[] = [];
    for (let i = 0; i < 3; i++) remaining.push((await asUser(path, 'alice').expect(200)).headers['x-ratelimit-remaining']);
    expect(remaining).toEqual(['2', '1', '0']);
    await asUser(path, 'alice').expect(429);
    // Bob is not Alice: his first request finds his own full bucket.
    const bob = await asUser(path, 'bob').expect(200);
    expect(bob.headers['x-ratelimit-remaining']).toBe('2');
    expect(await keysUnder(client, `${prefix}{`).then((keys) => keys.filter((key) => key.endsWith(`:${scope}`)))).toEqual(
      [`${prefix}{user:1}:${scope}`, `${prefix}{user:2}:${scope}`].sort(),
    );
    expect(warnings()).toEqual([]);
  });

  it('reads req.user.id before userId before sub', async () => {
    const scope = 'ShapesController.precedence';
    const as = (user: object) => get('/shapes/precedence', { 'x-user': JSON.stringify(user) }).expect(200);
    await as({ id: 'ann', userId: 'u-ben', sub: 's-cat' });
    await as({ id: 0, userId: 'u-ben', sub: 's-cat' });
    await as({ userId: 'u-ben', sub: 's-cat' });
    await as({ userId: 17, sub: 's-cat' });
    await as({ sub: 's-cat', username: 'cat' });
    await as({ sub: 42 });
    // null counts as absent: the next field is read.
    await as({ id: null, userId: null, sub: 'dan' });
    expect(await keysUnder(client, `${prefix}{`).then((keys) => keys.filter((key) => key.endsWith(`:${scope}`)))).toEqual(
      ['ann', '0', 'u-ben', '17', 's-cat', '42', 'dan'].map((id) => `${prefix}{user:${id}}:${scope}`).sort(),
    );
    expect(warnings().filter((line) => line.includes(scope))).toEqual([]);
  });

  it('falls back to the IP for an id that is not a non-empty string or a finite number, and says which', async () => {
    recorder.clear();
    const scope = 'ShapesController.odd';
    for (const odd of ['object', 'nan', 'infinity', 'true', 'empty']) {
      expect((await get('/shapes/odd', { 'x-user-id': odd }).expect(200)).headers['x-ratelimit-remaining']).toBe(
        String(19 - ['object', 'nan', 'infinity', 'true', 'empty'].indexOf(odd)),
      );
    }
    // Neither is { id: NaN } the next field's bucket: id is there, and it is not an id.
    await get('/shapes/odd', { 'x-user': JSON.stringify({ id: { oid: 'x' }, sub: 'eve' }) }).expect(200);
    expect(await keysUnder(client, `${prefix}{`).then((keys) => keys.filter((key) => key.endsWith(`:${scope}`)))).toEqual([
      `${prefix}{ip:127.0.0.1}:${scope}`,
    ]);
    const said = warnings();
    expect(said).toHaveLength(1);
    expect(said[0]).toContain(`keyBy 'user' on ${scope} found no user id`);
    expect(said[0]).toContain('req.user.id is an object');
    expect(said[0]).toContain('looked for req.user.id, then req.user.userId, then req.user.sub');
    expect(said[0]).toContain('keys: { user: (req) =>');
  });

  it('tells a request without req.user behind a guard that let it through from a route without any guard', async () => {
    recorder.clear();
    await get('/shapes/anonymous').expect(200);
    await get('/shapes/anonymous').expect(200);
    await get('/unguarded').expect(200);
    const [guarded, unguarded, ...rest] = warnings();
    expect(rest).toEqual([]);
    // The route has an auth guard: never advise adding one.
    expect(guarded).toContain("keyBy 'user' on ShapesController.anonymous found no user id: this request has no req.user");
    expect(guarded).toContain('looked for req.user.id, then req.user.userId, then req.user.sub');
    expect(guarded).toContain('limited by IP');
    expect(guarded).toContain('keys: { user: (req) =>');
    expect(guarded).not.toMatch(/put your auth guard|add .*guard/i);
    expect(guarded).toContain('The guards on this route let it through without setting req.user');
    // No guard of the app runs there: the user-keyed policy needs one that sets req.user.
    expect(unguarded).toContain("keyBy 'user' on UnguardedController.unguarded found no user id: this request has no req.user");
    expect(unguarded).toContain('No guard of the app runs on this route');
    expect(unguarded).toContain('put your auth guard on it');
    expect(unguarded).toContain('keys: { user: (req) =>');
    expect(await keysUnder(client, `${prefix}{ip:127.0.0.1}:ShapesController.anonymous`)).toHaveLength(1);
  });

  it('shows keys.user with the field to read when req.user has none of id, userId, sub', async () => {
    recorder.clear();
    await get('/shapes/fields', { 'x-user': JSON.stringify({ email: 'fay@example.com', roles: ['admin'] }) }).expect(200);
    const said = warnings();
    expect(said).toHaveLength(1);
    expect(said[0]).toContain("keyBy 'user' on ShapesController.fields found no user id: req.user has no id, userId or sub");
    // Its field names help to pick one; its values (an e-mail address here) are never logged.
    expect(said[0]).toContain('(its fields: email, roles)');
    expect(said[0]).not.toContain('fay@example.com');
    expect(said[0]).toContain('RateLimitModule.forRoot({ keys: { user: (req) => req.user.<field> } })');
    expect(said[0]).not.toMatch(/auth guard/i);
    expect(await keysUnder(client, `${prefix}{ip:127.0.0.1}:ShapesController.fields`)).toHaveLength(1);
  });
});
