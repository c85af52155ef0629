import { createHash } from 'node:crypto';

/**
 * Keys of the operator's side (analytics, overrides, blocks, audit): `<prefix>{ops}:<parts>`. They
 * share one hash tag, so on a Cluster they live in one slot: the periodic call of an instance is one
 * pipeline to one node, and a change is one transaction. No route or service key can equal one: a route
 * key's tag starts with an identity kind (`{ip:`, `{user:`...), and a service key ends at its `}`.
 */
export function opsKey(prefix: string, ...parts: string[]): string {
  return `${prefix}{ops}:${parts.join(':')}`;
}

/** A policy's scope as a key part: itself when short and plain, else `~` and its digest (never braces or spaces in a key). */
export function scopePart(scope: string): string {
  return /^[A-Za-z0-9._@-]{1,100}$/.test(scope) ? scope : `~${createHash('sha256').update(scope).digest('hex').slice(0, 32)}`;
}
