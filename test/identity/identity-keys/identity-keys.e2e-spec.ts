import { createHash } from 'node:crypto';
import { createHmac } from 'node:crypto';
import {
  apiKeyIdentity,
  assertRouteIdentity,
  createDigest,
  identity,
  ipIdentity,
  routeIdentity,
  routeIdentityKind,
  routeKey,
  serviceKey,
} from '../../../libs/rate-limit/src/keys/identity-keys.js';

const sha = (value: string) => createHash('sha256').update(value).digest('hex').slice(0, 32);

describe('identities', () => {
  it.each([
    ['203.0.113.7', 'ip:203.0.113.7'],
    ['::ffff:203.0.113.7', 'ip:203.0.113.7'],
    ['::FFFF:10.0.0.1', 'ip:10.0.0.1'],
    ['2001:db8:abcd:12:1:2:3:4', 'ip:2001:db8:abcd:12::'],
    ['2001:db8:abcd:12::99', 'ip:2001:db8:abcd:12::'],
    ['2001:0db8:0000:0012:ffff::1', 'ip:2001:db8:0:12::'],
    ['2001:db8::1', 'ip:2001:db8:0:0::'],
    ['::1', 'ip:0:0:0:0::'],
    ['fe80::1%eth0', 'ip:fe80:0:0:0::'],
    ['64:ff9b::192.0.2.33', 'ip:64:ff9b:0:0::'],
    [undefined, 'ip:unknown'],
  ])('writes the address %s as %s', (address, expected) => {
    expect(ipIdentity(address)).toBe(expected);
  });

  it.each([
    ['203.0.113.7:40001', 'ip:203.0.113.7'],
    ['203.0.113.7:1', 'ip:203.0.113.7'],
    ['[2001:db8::1]:443', 'ip:2001:db8:0:0::'],
    ['[2001:db8:abcd:12::99]', 'ip:2001:db8:abcd:12::'],
    ['[fe80::1%eth0]:8080', 'ip:fe80:0:0:0::'],
    ['[::ffff:192.0.2.1]:8080', 'ip:192.0.2.1'],
  ])('strips the port of %s before grouping: %s', (address, expected) => {
    expect(ipIdentity(address)).toBe(expected);
  });

  it.each([
    '::ffff:192.0.2.1',
    '::ffff:c000:201',
    '::FFFF:C000:0201',
    '0:0:0:0:0:ffff:192.0.2.1',
    '0:0:0:0:0:FFFF:C000:201',
    '0000:0000:0000:0000:0000:ffff:c000:0201',
    '::0:ffff:c000:201',
  ])('unmaps the IPv4-mapped form %s to ip:192.0.2.1', (address) => {
    expect(ipIdentity(address)).toBe('ip:192.0.2.1');
  });

  it('gives two clients behind IPv4-mapped addresses two buckets, not one', () => {
    expect(ipIdentity('::ffff:c000:202')).toBe('ip:192.0.2.2');
    expect(ipIdentity('0:0:0:0:0:ffff:198.51.100.9')).toBe('ip:198.51.100.9');
  });

  it.each([
    ['::1', 'ip:0:0:0:0::'],
    ['::ffff:0:c000:201', 'ip:0:0:0:0::'], // IPv4-translated (SIIT), not mapped
    ['64:ff9b::c000:201', 'ip:64:ff9b:0:0::'], // NAT64: a real IPv6 client network
    ['2001:db8::ffff:c000:201', 'ip:2001:db8:0:0::'],
  ])('keeps %s, which is not IPv4-mapped, as IPv6: %s', (address, expected) => {
    expect(ipIdentity(address)).toBe(expected);
  });

  it('does not take an unbracketed IPv6 address for one with a port, and hashes what is not an address', () => {
    expect(ipIdentity('2001:db8::1:443')).toBe('ip:2001:db8:0:0::');
    for (const odd of ['203.0.113.7:', '203.0.113.7:80:80', '203.0.113.7:123456', '[not-an-address]:80', '[2001:db8::1]:x']) {
      expect(ipIdentity(odd)).toBe(identity('ip', odd));
    }
    expect(ipIdentity('[not-an-address]:80')).toBe(`ip~${sha('[not-an-address]:80')}`);
  });

  it('groups two addresses of one /64 and separates neighbouring /64s', () => {
    expect(ipIdentity('2001:db8:1:2:aaaa::1')).toBe(ipIdentity('2001:db8:1:2:bbbb::2'));
    expect(ipIdentity('2001:db8:1:2::1')).not.toBe(ipIdentity('2001:db8:1:3::1'));
  });

  it('hashes anything that is not a plain short value, so braces and newlines never reach a key', () => {
    expect(identity('user', 'alice@example.com')).toBe('user:alice@example.com');
    expect(identity('user', 'a}b{c')).toBe(`user~${sha('a}b{c')}`);
    expect(identity('user', 'line\nbreak')).toBe(`user~${sha('line\nbreak')}`);
    expect(identity('user', 'x'.repeat(65))).toBe(`user~${sha('x'.repeat(65))}`);
    expect(identity('user', 'x'.repeat(64))).toBe(`user:${'x'.repeat(64)}`);
  });

  it('never writes an API key, only its truncated SHA-256', () => {
    expect(apiKeyIdentity('sk_live_123')).toBe(`key:${sha('sk_live_123')}`);
  });

  it('builds route keys with the identity as hash tag and service keys from the bucket name', () => {
    expect(routeKey('rl:', 'ip:1.2.3.4', '}:Ctrl.list')).toBe('rl:{ip:1.2.3.4}:Ctrl.list');
    expect(serviceKey('rl:', 'user:42:export')).toBe('rl:{user:42:export}');
    expect(serviceKey('rl:', 'has space')).toBe(`rl:{~${sha('has space')}}`);
  });
});

describe('route identities (the key text shared by the route limiter and BucketService)', () => {
  const hmac = (value: string) => createHmac('sha256', 's3cret').update(value).digest('hex').slice(0, 32);
  const hash = createDigest('s3cret');

  it.each([
    [{ ip: '203.0.113.7' }, 'ip:203.0.113.7'],
    [{ ip: '::ffff:203.0.113.7' }, 'ip:203.0.113.7'],
    [{ ip: '0:0:0:0:0:FFFF:CB00:7107' }, 'ip:203.0.113.7'],
    [{ ip: '203.0.113.7:40001' }, 'ip:203.0.113.7'],
    [{ ip: '2001:db8:abcd:12::99' }, 'ip:2001:db8:abcd:12::'],
    [{ ip: undefined }, 'ip:unknown'],
    [{ user: 42 }, 'user:42'],
    [{ user: '42' }, 'user:42'],
    [{ user: 'alice@example.com' }, 'user:alice@example.com'],
    [{ id: 'tenant-7' }, 'id:tenant-7'],
  ])('writes %j as %s, the way the limiter writes a request of that identity', (who, expected) => {
    expect(routeIdentity(who, hash)).toBe(expected);
  });

  it('digests with keys.secret exactly where the limiter does: API keys always, other values when not plain', () => {
    expect(routeIdentity({ apiKey: 'sk_live_123' }, hash)).toBe(`key:${hmac('sk_live_123')}`);
    expect(routeIdentity({ apiKey: 'sk_live_123' }, hash)).toBe(apiKeyIdentity('sk_live_123', hash));
    expect(routeIdentity({ apiKey: 'sk_live_123' })).toBe(`key:${sha('sk_live_123')}`);
    expect(routeIdentity({ user: 'a b' }, hash)).toBe(`user~${hmac('a b')}`);
    expect(routeIdentity({ user: 'a b' }, hash)).toBe(identity('user', 'a b', hash));
    expect(routeIdentity({ id: 'x'.repeat(65) }, hash)).toBe(`id~${hmac('x'.repeat(65))}`);
    // As ipIdentity does for the limiter today: what is not an address gets the plain SHA-256, secret or not.
    expect(routeIdentity({ ip: 'not an address' }, hash)).toBe(ipIdentity('not an address'));
    expect(routeIdentity({ ip: 'not an address' }, hash)).toBe(`ip~${sha('not an address')}`);
  });

  it('names the kind of an identity', () => {
    expect([{ ip: '1.2.3.4' }, { user: 1 }, { apiKey: 'k' }, { id: 'x' }].map(routeIdentityKind)).toEqual(['ip', 'user', 'apiKey', 'id']);
  });

  it.each([[{ ip: '1.2.3.4' }], [{ user: 42 }], [{ user: 0 }], [{ user: 'alice' }], [{ apiKey: 'sk_live_123' }], [{ id: 'tenant-7' }]])(
    'accepts %j',
    (who) => {
      expect(() => assertRouteIdentity(who, 'here')).not.toThrow();
    },
  );

  it.each([
    [undefined, 'here: the identity must be one of { ip } | { user } | { apiKey } | { id } (got undefined)'],
    [null, 'here: the identity must be one of { ip } | { user } | { apiKey } | { id } (got null)'],
    ['1.2.3.4', 'here: the identity must be one of { ip } | { user } | { apiKey } | { id } (got string)'],
    [['1.2.3.4'], 'here: the identity must be one of { ip } | { user } | { apiKey } | { id } (got an array)'],
    [{}, 'here: the identity must have exactly one of { ip } | { user } | { apiKey } | { id } (got an empty object)'],
    [
      { ip: '1.2.3.4', user: 42 },
      'here: the identity must have exactly one of { ip } | { user } | { apiKey } | { id } (got keys ip, user)',
    ],
    [{ address: '1.2.3.4' }, 'here: the identity must have exactly one of { ip } | { user } | { apiKey } | { id } (got key address)'],
    [{ ip: '' }, 'here: ip must be a non-empty string (got an empty string)'],
    [{ ip: 7 }, 'here: ip must be a non-empty string (got 7)'],
    [{ user: undefined }, 'here: user must be a non-empty string or a finite number (got undefined)'],
    [{ user: Number.NaN }, 'here: user must be a non-empty string or a finite number (got NaN)'],
    [{ user: Infinity }, 'here: user must be a non-empty string or a finite number (got Infinity)'],
    [{ user: '' }, 'here: user must be a non-empty string or a finite number (got an empty string)'],
    [{ user: { id: 1 } }, 'here: user must be a non-empty string or a finite number (got object)'],
    [{ id: null }, 'here: id must be a non-empty string (got null)'],
    [{ apiKey: 12345 }, 'here: apiKey must be a non-empty string (got number)'],
  ])('refuses %j with a clear error', (who, message) => {
    // The library's wording, then the code's lines (RateLimitConfigError: `reason` is the wording alone).
    expect(() => assertRouteIdentity(who, 'here')).toThrow(
      expect.objectContaining({ reason: message, code: 'ERR_RATE_LIMIT_INVALID_IDENTITY' }),
    );
  });
});
