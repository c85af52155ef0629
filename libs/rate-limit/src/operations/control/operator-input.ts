import { isIP } from 'node:net';
import { RateLimitInputError } from '../../errors/rate-limit.errors.js';
import { type Digest, ipIdentity, ROUTE_IDENTITY_KINDS, routeIdentity, type RouteIdentity } from '../../keys/identity-keys.js';
import { SAFE_IDENTITY } from '../../rate-limit.constants.js';

/**
 * Checks of what an operator sends (through `RateLimitInsights` or the dashboard), as strict as
 * `forRoot`: each failure is a `RateLimitInputError` that names the field, and nothing is changed.
 */

const HASHED = /^(?:ip|user|id)~[0-9a-f]{32}$/;
const API_KEY = /^key:[0-9a-f]{32}$/;

/** Longest reason and operator name kept in the audit trail. */
export const MAX_REASON = 200;
export const MAX_OPERATOR = 100;
/** Longest block: 30 days. */
export const MAX_BLOCK_SECONDS = 30 * 24 * 3600;

export function text(value: unknown, field: string, max: number, required = true): string | undefined {
  if (value === undefined && !required) return undefined;
  if (typeof value !== 'string' || value.trim() === '') throw new RateLimitInputError(`${field} must be a non-empty string`);
  if (value.length > max) throw new RateLimitInputError(`${field} must be at most ${max} characters (got ${value.length})`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(value)) throw new RateLimitInputError(`${field} must not contain control characters`);
  return value;
}

/**
 * An identity as the limiter keys it, from its keyed text (`ip:203.0.113.7`, `user:42`, `key:<digest>`,
 * `id:…`, or a hashed `user~<digest>`) or from a `RouteIdentity` (`{ ip }`, `{ user }`, `{ apiKey }`, `{ id }`),
 * which is keyed the way the limiter keys requests (an API key becomes its digest here and is never kept).
 */
export function keyedIdentity(value: unknown, field: string, hash: Digest): string {
  if (typeof value === 'object' && value !== null && !Array.isArray(value)) {
    const keys = Object.keys(value);
    const kind = keys[0];
    const inner = (value as Record<string, unknown>)[kind];
    const ok =
      keys.length === 1 &&
      (ROUTE_IDENTITY_KINDS as readonly string[]).includes(kind) &&
      ((typeof inner === 'string' && inner !== '' && inner.length <= 1024) ||
        (kind === 'user' && typeof inner === 'number' && Number.isFinite(inner)));
    if (!ok)
      throw new RateLimitInputError(
        `${field} must be one of { ip }, { user }, { apiKey }, { id } with a non-empty value of at most 1024 characters`,
      );
    if (kind === 'ip' && isIP(String(inner)) === 0) throw new RateLimitInputError(`${field}.ip must be an IPv4 or IPv6 address`);
    return routeIdentity(value as RouteIdentity, hash);
  }
  if (typeof value !== 'string' || value === '')
    throw new RateLimitInputError(`${field} must be a keyed identity (ip:…, user:…, key:…, id:…) or { ip | user | apiKey | id }`);
  if (value.length > 100) throw new RateLimitInputError(`${field} must be at most 100 characters`);
  if (value.startsWith('ip:')) {
    const address = value.slice(3);
    if (isIP(address) === 0) throw new RateLimitInputError(`${field} must name an IPv4 or IPv6 address after ip:`);
    // As the limiter keys it: IPv4-mapped addresses unmapped, IPv6 by its /64.
    return ipIdentity(address);
  }
  if (HASHED.test(value) || API_KEY.test(value)) return value;
  const colon = value.indexOf(':');
  const kind = value.slice(0, colon);
  if ((kind === 'user' || kind === 'id') && SAFE_IDENTITY.test(value.slice(colon + 1))) return value;
  throw new RateLimitInputError(
    `${field} must be as the limiter keys it: ip:<address>, user:<id>, id:<value> (letters, digits and . _ : @ -, at most 64), ` +
      'key:<digest> or a hashed <kind>~<digest> (32 hex digits)',
  );
}

/**
 * What a block refuses: a keyed identity, or an address range `ip:<network>/<bits>` (IPv4 /8 to /32;
 * IPv6 /16 to /64, since IPv6 clients are keyed by their /64). A single IPv6 address blocks its /64.
 */
export function blockTarget(value: unknown, field: string, hash: Digest): string {
  if (typeof value === 'string' && value.startsWith('ip:') && value.includes('/')) {
    const [address, bits, extra] = value.slice(3).split('/');
    const family = isIP(address);
    const n = /^\d{1,3}$/.test(bits ?? '') ? Number(bits) : NaN;
    if (family === 0 || extra !== undefined)
      throw new RateLimitInputError(`${field} must be ip:<network>/<bits> with an IPv4 or IPv6 network`);
    if (family === 4 && !(n >= 8 && n <= 32)) throw new RateLimitInputError(`${field}: an IPv4 range must be /8 to /32 (got /${bits})`);
    if (family === 6 && !(n >= 16 && n <= 64))
      throw new RateLimitInputError(`${field}: an IPv6 range must be /16 to /64 (clients are keyed by their /64) (got /${bits})`);
    return `ip:${address.toLowerCase()}/${n}`;
  }
  return keyedIdentity(value, field, hash);
}

/** A whole number of seconds from `min` to `max`. */
export function seconds(value: unknown, field: string, min: number, max: number, required = true): number | undefined {
  if (value === undefined && !required) return undefined;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
    throw new RateLimitInputError(`${field} must be an integer from ${min} to ${max} (got ${JSON.stringify(value) ?? String(value)})`);
  }
  return value;
}

/** Refuses keys an input object does not have (a typo would otherwise be ignored). */
export function onlyKeys(value: unknown, known: readonly string[], field: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new RateLimitInputError(`${field} must be an object`);
  for (const key of Object.keys(value)) {
    if (!known.includes(key))
      throw new RateLimitInputError(`${field} has an unknown field ${JSON.stringify(key.slice(0, 40))} (known: ${known.join(', ')})`);
  }
  return value as Record<string, unknown>;
}
