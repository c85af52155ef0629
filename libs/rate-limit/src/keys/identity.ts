import { createHash, createHmac } from 'node:crypto';
import { isIPv4, isIPv6 } from 'node:net';
import { DIGEST_LENGTH, SAFE_IDENTITY } from '../rate-limit.constants.js';

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
 * The client address as a bucket identity: IPv4-mapped IPv6 is unmapped, and real IPv6 addresses are
 * grouped by their /64, since one subscriber usually holds a whole /64.
 */
export function ipIdentity(address: string | undefined): string {
  if (!address) return 'ip:unknown';
  const mapped = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(address);
  if (mapped && isIPv4(mapped[1])) return `ip:${mapped[1]}`;
  if (isIPv4(address)) return `ip:${address}`;
  const zoneless = address.split('%')[0];
  if (isIPv6(zoneless)) return `ip:${ipv6Prefix64(zoneless)}`;
  return identity('ip', address);
}

/** The /64 network of an IPv6 address, written `a:b:c:d::`. */
function ipv6Prefix64(address: string): string {
  const [head, tail = ''] = address.toLowerCase().split('::');
  const headGroups = head ? head.split(':') : [];
  const tailGroups = address.includes('::') && tail ? tail.split(':') : [];
  // An embedded IPv4 tail (a.b.c.d) counts as two groups; it only ever lies in the low 64 bits.
  const width = (groups: string[]) => groups.reduce((n, g) => n + (g.includes('.') ? 2 : 1), 0);
  const missing = 8 - width(headGroups) - width(tailGroups);
  const groups = address.includes('::')
    ? [...headGroups, ...new Array<string>(missing).fill('0'), ...tailGroups]
    : headGroups;
  return `${groups
    .slice(0, 4)
    .map((g) => parseInt(g, 16).toString(16))
    .join(':')}::`;
}

/** Key of a route bucket: `{prefix}{<identity>}:<scope>`, the identity as the Cluster hash tag. */
export function routeKey(prefix: string, id: string, keySuffix: string): string {
  return `${prefix}{${id}${keySuffix}`;
}

/** Key of a `BucketService` bucket: `{prefix}{<name>}`, a name outside the plain alphabet hashed. */
export function serviceKey(prefix: string, name: string, hash: Digest = digest): string {
  return `${prefix}{${SAFE_IDENTITY.test(name) ? name : `~${hash(name)}`}}`;
}
