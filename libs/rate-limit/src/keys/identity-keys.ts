import { createHash, createHmac } from 'node:crypto';
import { isIPv4, isIPv6 } from 'node:net';
import { DIGEST_LENGTH, SAFE_IDENTITY } from '../rate-limit.constants.js';
import { RateLimitConfigError } from '../errors/rate-limit.errors.js';

/** Turns a value into the fixed-length hex text that stands for it in key names. */
export type Digest = (value: string) => string;

/** Truncated SHA-256 hex digest. */
export function digest(value: string): string {
  return createHash('sha256').update(value).digest('hex').slice(0, DIGEST_LENGTH);
}

/**
 * The digest of key names: an HMAC of `secret` when one is set (`keys.secret`), so that nobody without
 * it can compute which key, and which Cluster slot, a made-up value lands in; else plain SHA-256.
 */
export function createDigest(secret: string | undefined): Digest {
  if (secret === undefined) return digest;
  return (value) => createHmac('sha256', secret).update(value).digest('hex').slice(0, DIGEST_LENGTH);
}

/**
 * `kind:value` when the value is short and plain; otherwise `kind~digest`. `~` never appears in a plain
 * value, so a hashed identity cannot equal a plain one, and braces or newlines never reach a key.
 */
export function identity(kind: string, value: string, hash: Digest = digest): string {
  return SAFE_IDENTITY.test(value) ? `${kind}:${value}` : `${kind}~${hash(value)}`;
}

/** An API key is a secret: only its digest ever appears in a key name. */
export function apiKeyIdentity(apiKey: string, hash: Digest = digest): string {
  return `key:${hash(apiKey)}`;
}

/**
 * The client address as a bucket identity. A port is dropped first (`203.0.113.7:40001`,
 * `[2001:db8::1]:443`, as some proxies write X-Forwarded-For), so a client cannot get a new bucket per
 * source port. An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`, `::ffff:c000:201`,
 * `0:0:0:0:0:ffff:192.0.2.1`, in any case) is the IPv4 address it carries. Real IPv6 addresses are
 * grouped by their /64, since one subscriber usually holds a whole /64.
 */
export function ipIdentity(address: string | undefined): string {
  if (!address) return 'ip:unknown';
  const host = withoutPort(address);
  if (isIPv4(host)) return `ip:${host}`;
  const zoneless = host.split('%')[0];
  if (isIPv6(zoneless)) {
    const groups = ipv6Groups(zoneless);
    if (isIPv4Mapped(groups)) {
      return `ip:${groups[6] >> 8}.${groups[6] & 0xff}.${groups[7] >> 8}.${groups[7] & 0xff}`;
    }
    return `ip:${groups
      .slice(0, 4)
      .map((g) => g.toString(16))
      .join(':')}::`;
  }
  return identity('ip', address);
}

/**
 * The address without a port: `a.b.c.d:port` and `[v6]:port` (and `[v6]`) lose it. An IPv6 address
 * without brackets keeps everything: its last group cannot be told from a port.
 */
function withoutPort(address: string): string {
  const v4 = /^(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}$/.exec(address);
  if (v4) return v4[1];
  const v6 = /^\[([0-9A-Fa-f:.]+(?:%[^\]]+)?)\](?::\d{1,5})?$/.exec(address);
  return v6 ? v6[1] : address;
}

/** `::ffff:0:0/96`: the first 80 bits zero, the next 16 bits one. */
function isIPv4Mapped(groups: readonly number[]): boolean {
  return groups[0] === 0 && groups[1] === 0 && groups[2] === 0 && groups[3] === 0 && groups[4] === 0 && groups[5] === 0xffff;
}

/** The eight 16-bit groups of a valid IPv6 address (`::` expanded, an embedded IPv4 tail as two groups). */
function ipv6Groups(address: string): number[] {
  const parse = (part: string): number[] =>
    part === ''
      ? []
      : part.split(':').flatMap((group) => {
          if (!group.includes('.')) return [parseInt(group, 16)];
          const [a, b, c, d] = group.split('.').map(Number);
          return [(a << 8) | b, (c << 8) | d];
        });
  const double = address.indexOf('::');
  if (double < 0) return parse(address);
  const head = parse(address.slice(0, double));
  const tail = parse(address.slice(double + 2));
  return [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail];
}

/** Key of a route bucket: `{prefix}{<identity>}:<scope>`, the identity as the Cluster hash tag. */
export function routeKey(prefix: string, id: string, keySuffix: string): string {
  return `${prefix}{${id}${keySuffix}`;
}

/** Key of a `BucketService` bucket: `{prefix}{<name>}`, a name outside the plain alphabet hashed. */
export function serviceKey(prefix: string, name: string, hash: Digest = digest): string {
  return `${prefix}{${SAFE_IDENTITY.test(name) ? name : `~${hash(name)}`}}`;
}

/**
 * Whose route bucket, as `BucketService.peekRoute()` / `resetRoute()` take it — the identities the route
 * limiter finds on a request, one kind each:
 * - `{ ip }`: the client address (`keyBy: 'ip'`, and the fallback of every other keyBy);
 * - `{ user }`: the user id (`keyBy: 'user'`, from `keys.user` or `req.user.id` / `userId` / `sub`);
 * - `{ apiKey }`: the API key (`keyBy: 'apiKey'`), as `keys.apiKey` returns it, else the raw header value;
 * - `{ id }`: what a keyBy function returned.
 */
export type RouteIdentity = { ip: string } | { user: string | number } | { apiKey: string } | { id: string };

/** The kinds of `RouteIdentity`, in the order messages list them. */
export const ROUTE_IDENTITY_KINDS = ['ip', 'user', 'apiKey', 'id'] as const;
export type RouteIdentityKind = (typeof ROUTE_IDENTITY_KINDS)[number];

/**
 * The identity part of a route key (the Cluster hash tag of `routeKey`): the one function that turns an
 * identity into key text, for the route limiter and `BucketService` alike, so both name the same bucket
 * byte for byte. An address is normalised by `ipIdentity` (port dropped, IPv4-mapped unmapped, IPv6 by
 * its /64; `{ ip: undefined }` is `ip:unknown`, a request without an address); user ids and keyBy
 * results are written plain or hashed with `hash` (`identity`); an API key is always hashed.
 */
export function routeIdentity(who: RouteIdentity | { ip: string | undefined }, hash: Digest = digest): string {
  if ('ip' in who) return ipIdentity(who.ip);
  if ('user' in who) return identity('user', String(who.user), hash);
  if ('apiKey' in who) return apiKeyIdentity(who.apiKey, hash);
  return identity('id', who.id, hash);
}

/** The kind of a valid `RouteIdentity`. */
export function routeIdentityKind(who: RouteIdentity): RouteIdentityKind {
  return ROUTE_IDENTITY_KINDS.find((kind) => kind in who) as RouteIdentityKind;
}

/**
 * Checks an identity given by a caller: a plain object with exactly one of `ip`, `user`, `apiKey`, `id`;
 * a non-empty string (a user id may also be a finite number, as the limiter accepts). `where` names the
 * call in the error. The error never shows an API key, only that it was wrong.
 */
export function assertRouteIdentity(who: unknown, where: string): asserts who is RouteIdentity {
  const shape = `{ ${ROUTE_IDENTITY_KINDS.join(' } | { ')} }`;
  if (typeof who !== 'object' || who === null || Array.isArray(who)) {
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_IDENTITY',
      `${where}: the identity must be one of ${shape} (got ${who === null ? 'null' : Array.isArray(who) ? 'an array' : typeof who})`,
    );
  }
  const keys = Object.keys(who);
  const unknown = keys.filter((key) => !(ROUTE_IDENTITY_KINDS as readonly string[]).includes(key));
  if (keys.length !== 1 || unknown.length > 0) {
    const got = keys.length === 0 ? 'an empty object' : `${keys.length === 1 ? 'key' : 'keys'} ${keys.join(', ')}`;
    throw new RateLimitConfigError(
      'ERR_RATE_LIMIT_INVALID_IDENTITY',
      `${where}: the identity must have exactly one of ${shape} (got ${got})`,
    );
  }
  const kind = keys[0] as RouteIdentityKind;
  const value: unknown = (who as Record<string, unknown>)[kind];
  if (typeof value === 'string' && value !== '') return;
  if (kind === 'user' && typeof value === 'number' && Number.isFinite(value)) return;
  const wanted = kind === 'user' ? 'a non-empty string or a finite number' : 'a non-empty string';
  const shown = typeof value === 'number' || typeof value === 'boolean' || value === undefined;
  const got = value === '' ? 'an empty string' : value === null ? 'null' : kind !== 'apiKey' && shown ? String(value) : typeof value;
  throw new RateLimitConfigError('ERR_RATE_LIMIT_INVALID_IDENTITY', `${where}: ${kind} must be ${wanted} (got ${got})`);
}
